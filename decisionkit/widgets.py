"""Try-it panels: type a text (or paste a JSON state), see every answer, its confidence and the routing verdict.

``DecisionPanel(model).widget()`` works in any notebook with any trained model. With a router, the answers are
distance-aware and the slider starts at the router's confidence threshold; untick ``distance-aware`` to see the
heads alone. Its parts (``text``, ``workflow``, ``button``, ``threshold``, ``distance_aware``, ``verdict``,
``plot``) are public so a test can drive it the way a learner
does: set the text, press the button, read the verdict.
"""

from __future__ import annotations

import json
from typing import Any

import ipywidgets as w
import plotly.io as pio

from .anomaly import lowest_confidence
from .plots import answer_bars


def parse_state(text: str) -> Any:
    """A JSON object or array when the text is one; the text itself otherwise (a ticket, a poem)."""
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            pass
    return text


class DecisionPanel:
    """Text in; probability bars, confidence and verdict out. A threshold slider on the lowest confidence."""

    def __init__(self, model, text: str = "", workflow: str | None = None, threshold: float | None = None):
        self.model = model
        router = model.router
        if threshold is None:
            threshold = router.threshold if router is not None and router.score == "confidence" else 0.6
        workflows = sorted(model.schema)
        self.workflow = w.Dropdown(options=workflows, value=workflow or workflows[0], description="workflow")
        self.text = w.Textarea(value=text, placeholder="a text, or a JSON state",
                               layout=w.Layout(width="100%", height="120px"))
        self.button = w.Button(description="Decide", button_style="primary")
        self.threshold = w.FloatSlider(value=threshold, min=0.0, max=1.0, step=0.001, readout_format=".3f",
                                       description="answer if ≥", style={"description_width": "initial"})
        self.distance_aware = w.Checkbox(value=router is not None, disabled=router is None,
                                         description="distance-aware")
        self.verdict = w.HTML()
        self.plot = w.Output()
        self.result: dict | None = None
        self.button.on_click(lambda _: self.run())
        self.threshold.observe(lambda _: self._show_verdict(), names="value")
        self.distance_aware.observe(lambda _: self.run() if self.result is not None else None, names="value")

    def run(self) -> dict:
        """Answer the current text; with a saved router, route it too."""
        state = parse_state(self.text.value)
        if self.model.router is not None:
            self.result = self.model.route(state, workflow=self.workflow.value, raw=not self.distance_aware.value)
        else:
            self.result = {"answers": self.model.decide(state, workflow=self.workflow.value), "scores": {}}
        # Set the output directly (plotly's own mimetype, which JupyterLab and VS Code render) rather than capture
        # it with ``with self.plot: display(...)``: under nbconvert the capture left notebook 08's execution
        # waiting forever (nbclient 0.11, 2026-11-30).
        bundle = pio.renderers["plotly_mimetype"].to_mimebundle(answer_bars(self.result["answers"]).to_dict())
        self.plot.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)
        self._show_verdict()
        return self.result

    def decision(self) -> tuple[str, str]:
        """("answer" | "human", why), from the confidence threshold and, when there is one, the router."""
        confidence = lowest_confidence(self.result["answers"])
        if confidence < self.threshold.value:
            return "human", f"lowest confidence {confidence:.1%} is below {self.threshold.value:.1%}"
        if self.result.get("verdict") == "human":
            return "human", self.result["reason"]
        return "answer", f"lowest confidence {confidence:.1%} is at least {self.threshold.value:.1%}"

    def _show_verdict(self) -> None:
        if self.result is None:
            return
        verdict, reason = self.decision()
        colour = "#b00020" if verdict == "human" else "#1b5e20"
        scores = ", ".join(f"{k} {v:.3g}" for k, v in self.result["scores"].items() if ":" not in k)
        self.verdict.value = (f"<b style='color:{colour}'>verdict: {verdict}</b> — {reason}"
                              + (f"<br><small>anomaly scores: {scores}</small>" if scores else ""))

    def widget(self) -> w.VBox:
        return w.VBox([w.HBox([self.workflow, self.button, self.distance_aware]), self.text, self.threshold,
                       self.verdict, self.plot])
