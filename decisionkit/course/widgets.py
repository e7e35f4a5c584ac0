"""Try-it panels: type a text (or paste a JSON state), see every answer, its confidence and the routing verdict.

``DecisionPanel(model).widget()`` works in any notebook with any trained model. With a router, the answers are
distance-aware and the slider starts at the router's confidence threshold; untick ``distance-aware`` to see the
heads alone. Its parts (``text``, ``workflow``, ``button``, ``threshold``, ``distance_aware``, ``verdict``,
``plot``) are public so a test can drive it the way a learner
does: set the text, press the button, read the verdict.

A saved notebook shows the panel without a kernel too: the cell's output carries, beside the widget view, the last
answer as a PNG of its bars and an HTML fallback (the verdict above that PNG), which GitHub and ``nbconvert --to
html`` show where no widget can run (see ``static_bundle``). The fallback is the answer at the time the cell ran.
"""

from __future__ import annotations

import html
import json
from typing import Any

import ipywidgets as w

from ..core import plots
from ..core.answer_fields import answer_probabilities, lowest_confidence
from ..core.plots import answer_bars
from ..model.routing import shown


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
        self.bundle: dict = {}  # the last answer's bars: plotly JSON and, where kaleido renders, its PNG
        self._box: _PanelBox | None = None
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
        # Set the output directly rather than capture it with ``with self.plot: display(...)``: under nbconvert the
        # capture left notebook 08's execution waiting forever (nbclient 0.11, 2026-11-30). The Output gets plotly's
        # own mimetype alone, which JupyterLab and VS Code draw interactive: given a PNG beside it, JupyterLab showed
        # the PNG there (an Output's content is not trusted, and plotly's renderer is not a safe one). The PNG is
        # kept for ``static_bundle``.
        self.bundle = plots.mimebundle(answer_bars(self.result["answers"]))
        interactive = {k: v for k, v in self.bundle.items() if k != "image/png"}
        self.plot.outputs = ({"output_type": "display_data", "data": interactive, "metadata": {}},)
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
        scores = ", ".join(f"{k} {shown(v)}" for k, v in self.result["scores"].items() if ":" not in k)
        self.verdict.value = (f"<b style='color:{colour}'>verdict: {verdict}</b> — {reason}"
                              + (f"<br><small>anomaly scores: {scores}</small>" if scores else ""))

    def static_bundle(self) -> dict:
        """The last answer for viewers that run no widget: ``image/png`` (the bars) and ``text/html`` (the verdict,
        then the bars as that PNG or, where kaleido cannot render, as a table of probabilities)."""
        if self.result is None:
            return {"text/html": "<p><i>DecisionPanel: no answer yet; press <b>Decide</b> in a live notebook.</i></p>"}
        bundle = {}
        if "image/png" in self.bundle:
            bundle["image/png"] = self.bundle["image/png"]
            bars = f"<img alt='answer probabilities' src='data:image/png;base64,{self.bundle['image/png']}'/>"
        else:
            bars = "".join(
                f"<tr><td>{html.escape(qid)}</td><td>{html.escape(option)}</td><td>{p:.1%}</td></tr>"
                for qid, a in self.result["answers"].items()
                for option, p in answer_probabilities(a).items())
            bars = f"<table><tr><th>question</th><th>answer</th><th>probability</th></tr>{bars}</table>"
        bundle["text/html"] = f"<div class='decisionkit-panel'><p>{self.verdict.value}</p>{bars}</div>"
        return bundle

    def widget(self) -> w.VBox:
        """The panel's view (one box, the same at every call); as a cell's result it also carries ``static_bundle``."""
        if self._box is None:
            self._box = _PanelBox(self, [w.HBox([self.workflow, self.button, self.distance_aware]), self.text,
                                         self.threshold, self.verdict, self.plot])
        return self._box

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return self.widget()._repr_mimebundle_(**kwargs)


class _PanelBox(w.VBox):
    """The panel's VBox; its display adds the static fallback beside the widget view. Front ends that run widgets
    (JupyterLab, VS Code) rank the widget view first; nbconvert skips it when the notebook has no saved state for
    it (as JupyterLab saves by default) and GitHub shows the HTML."""

    def __init__(self, panel: DecisionPanel, children):
        super().__init__(children)
        self._panel = panel

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return {**self._panel.static_bundle(), **super()._repr_mimebundle_(**kwargs)}
