"""Every figure of the course, built with plotly. Functions return a figure; they never call ``.show()``.

``notebook_setup()`` (first cell of every notebook) makes each figure a cell shows travel two ways: plotly's own
mimetype, which JupyterLab and VS Code draw interactive, and a PNG of it, which is what GitHub, nbviewer and
``nbconvert --to html`` show without a kernel or a network. The PNG comes from kaleido driving a local Chrome or
Chromium (Debian's ``chromium`` here); without one, figures stay interactive only and a warning says why.
``mimebundle(fig)`` is the same pair for a figure placed inside a widget.
"""

from __future__ import annotations

import atexit
import base64
import math
import warnings

import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio

from .answer_fields import answer_probabilities

TEMPLATE = "plotly_white"
PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3")  # plotly's default order
STATIC_FORMAT = "png"  # shown by GitHub, nbviewer and nbconvert alike; an SVG of a 1,000-point scatter is megabytes
STATIC_SCALE = 1.5  # sharper than plotly's 1.0 on a high-density screen, ~60 KB a figure
_static: dict = {}  # whether kaleido renders here, tried once per process


def static_images() -> bool:
    """Whether figures can be rendered to images here (kaleido finds a browser); tried once, then remembered.
    Kaleido's browser is started once and reused: a figure then takes ~0.1 s instead of ~2 s."""
    if "ok" not in _static:
        try:
            import kaleido
            from choreographer.browsers.chromium import Chromium

            # without a browser kaleido's server never answers: look for one first (kaleido's own download too)
            if Chromium.find_browser(skip_local=False) is None:
                raise RuntimeError("no Chrome or Chromium found (Debian: apt-get install chromium)")
            kaleido.start_sync_server(silence_warnings=True)
            atexit.register(kaleido.stop_sync_server, silence_warnings=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "kopts ignored when using a server": we pass none
                pio.to_image(go.Figure(), format=STATIC_FORMAT, width=20, height=20)
            _static["ok"] = True
        except Exception as error:  # no kaleido, or no Chrome/Chromium for it to drive
            warnings.warn(f"figures stay interactive only, with no image for static viewers: {error}")
            _static["ok"] = False
    return _static["ok"]


def notebook_setup() -> str:
    """Show every figure as plotly's interactive mimetype plus a static image (see the module docstring); returns
    the renderer now in use."""
    pio.renderers["png"].scale = STATIC_SCALE
    warnings.filterwarnings("ignore", "The kopts argument is ignored", UserWarning)  # we pass none
    pio.renderers.default = "plotly_mimetype+png" if static_images() else "plotly_mimetype"
    return pio.renderers.default


def mimebundle(fig: go.Figure) -> dict:
    """What ``fig`` displays as: plotly's JSON (interactive) and, where ``static_images()``, a PNG beside it."""
    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
    if static_images():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            png = pio.to_image(fig, format=STATIC_FORMAT, scale=STATIC_SCALE)
        bundle["image/png"] = base64.b64encode(png).decode()
    return bundle


# The two paths of notebook 00's opener: (label, x of its centre) per box; one row per path.
_GENERATE = (("state + prompt", 0.09), ("LLM: one forward pass<br>per generated token", 0.29),
             ("JSON text, token<br>by token", 0.49), ("parse it<br>(it can break)", 0.69),
             ("one label per question,<br>no probability", 0.89))
_DECIDE = (("state", 0.09), ("language model:<br>one forward pass", 0.29), ("pool the last hidden<br>states: one vector", 0.49),
           ("one linear head per<br>typed question", 0.69), ("a probability for every<br>option, confidence", 0.89))


def two_paths() -> go.Figure:
    """The diagram of notebook 00: generating JSON token by token (a forward pass per token, then a parse) against
    a decision model (one forward pass, one pooled vector, a linear head per question), and the hybrid's trees on
    the state's fields beside the heads."""
    fig = go.Figure()
    rows = (("Generate JSON (what the course replaces)", 0.74, _GENERATE, PALETTE[1]),
            ("Decision model (what the course builds)", 0.32, _DECIDE, PALETTE[0]))
    for title, y, boxes, colour in rows:
        fig.add_annotation(x=0.0, y=y + 0.25, text=f"<b>{title}</b>", showarrow=False, xanchor="left",
                           font={"size": 14, "color": colour})
        for k, (label, x) in enumerate(boxes):
            fig.add_shape(type="rect", x0=x - 0.08, x1=x + 0.08, y0=y - 0.09, y1=y + 0.09, line_color=colour,
                          fillcolor="white")
            fig.add_annotation(x=x, y=y, text=label, showarrow=False, font={"size": 11})
            if k:
                fig.add_annotation(x=x - 0.08, y=y, ax=boxes[k - 1][1] + 0.08, ay=y, xref="x", yref="y",
                                   axref="x", ayref="y", text="", showarrow=True, arrowhead=2, arrowcolor=colour)
    # the decoding loop: each new token goes back in as input
    fig.add_annotation(x=0.29, y=0.87, ax=0.49, ay=0.87, xref="x", yref="y", axref="x", ayref="y", text="",
                       showarrow=True, arrowhead=2, arrowcolor=PALETTE[1])
    fig.add_annotation(x=0.39, y=0.9, text="each new token is fed back: tens to hundreds of passes",
                       showarrow=False, yanchor="bottom",
                       font={"size": 11, "color": PALETTE[1]})
    # the hybrid: trees on the state's own fields, averaged with the heads per question
    fig.add_shape(type="rect", x0=0.61, x1=0.77, y0=0.02, y1=0.14, line={"color": PALETTE[2], "dash": "dash"},
                  fillcolor="white")
    fig.add_annotation(x=0.69, y=0.08, text="hybrid: trees on the<br>state's fields, averaged in", showarrow=False,
                       font={"size": 11})
    fig.add_annotation(x=0.69, y=0.23, ax=0.69, ay=0.14, xref="x", yref="y", axref="x", ayref="y", text="",
                       showarrow=True, arrowhead=2, arrowcolor=PALETTE[2])
    fig.update_xaxes(visible=False, range=[0, 0.98])
    fig.update_yaxes(visible=False, range=[0, 1.06])
    return fig.update_layout(template=TEMPLATE, title="Two ways to get typed answers from a language model",
                             width=980, height=430, margin={"l": 10, "r": 10, "t": 50, "b": 10})


def length_histogram(stats) -> go.Figure:
    """Token lengths of a split's rendered states, one colour per workflow."""
    fig = px.histogram(x=stats.lengths, color=stats.workflows, nbins=40, barmode="overlay", opacity=0.6,
                       labels={"x": "tokens per rendered state", "color": "workflow"}, template=TEMPLATE,
                       title=f"Token lengths ({stats.split} split)")
    if stats.window is not None:
        fig.add_vline(x=stats.window, line_dash="dash", annotation_text=f"window: {stats.window} tokens")
    return fig.update_layout(yaxis_title="cases")


def probe_bars(comparison) -> go.Figure:
    """Validation accuracy per question type for each probe setting, each bar with its 95% Wilson interval."""
    long = comparison.accuracies().round({"accuracy": 3})
    long["plus"], long["minus"] = long["high"] - long["accuracy"], long["accuracy"] - long["low"]
    fig = px.bar(long, x="decisions", y="accuracy", color="probe", barmode="group", template=TEMPLATE,
                 error_y="plus", error_y_minus="minus",
                 title="Linear probe on frozen features: validation accuracy (bars: 95% interval)")
    return fig.update_layout(yaxis_range=[0, 1])


def learning_curve_figure(curve) -> go.Figure:
    """Held-out accuracy and cross-entropy as the training set grows, with the gold-entropy floor."""
    from plotly.subplots import make_subplots

    rows = curve.rows
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out accuracy", "soft cross-entropy"))
    fig.add_scatter(x=rows.index, y=rows["accuracy"], mode="lines+markers", name="accuracy", row=1, col=1)
    fig.add_scatter(x=rows.index, y=rows["held-out cross-entropy"], mode="lines+markers", name="held-out", row=1,
                    col=2)
    fig.add_scatter(x=rows.index, y=rows["train cross-entropy"], mode="lines+markers", name="train", row=1, col=2)
    fig.add_hline(y=curve.floor, line_dash="dot", annotation_text="gold entropy (floor)", row=1, col=2)
    fig.update_xaxes(type="log", title="train cases (log scale)", tickvals=list(rows.index),
                     ticktext=[f"{n:,}" for n in rows.index])  # the sizes trained, each labelled in full
    fig.update_yaxes(title="accuracy on the held-out cases", row=1, col=1)
    fig.update_yaxes(title="cross-entropy (nats per decision)", row=1, col=2)
    return fig.update_layout(template=TEMPLATE, title="Heads on frozen features: more data, same features")


def finetune_curves(histories: dict) -> go.Figure:
    """Dev loss and accuracy along fine-tuning, one line per run (name -> history); epoch 0 is the stage-1 heads
    on the frozen backbone, where every fine-tuning run starts."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("dev soft cross-entropy", "dev accuracy"))
    for k, (name, history) in enumerate(histories.items()):
        tuned = history[history["stage"] != "heads"].dropna(subset=["val_loss"])
        start = history[history["stage"] == "heads"]["val_loss"].min()
        color = PALETTE[k % len(PALETTE)]
        fig.add_scatter(x=[0, *tuned["epoch"]], y=[start, *tuned["val_loss"]], mode="lines+markers", name=name,
                        line_color=color, legendgroup=name, row=1, col=1)
        fig.add_scatter(x=tuned["epoch"], y=tuned["val_accuracy"], mode="lines+markers", name=name, showlegend=False,
                        line_color=color, legendgroup=name, row=1, col=2)
    fig.update_xaxes(title="epoch of fine-tuning")
    return fig.update_layout(template=TEMPLATE, title="Fine-tuning, scored on the dev slice")


def ladder_bars(by_workflow, low=None, high=None) -> go.Figure:
    """Test accuracy per workflow (x), one bar per model (``report.Ladder.by_workflow``'s columns); ``low`` and
    ``high``, frames of the same shape, draw each bar's interval."""
    fig = go.Figure()
    for k, name in enumerate(by_workflow.columns):
        bars = by_workflow[name]
        error = None if low is None else {"type": "data", "symmetric": False, "thickness": 1,
                                          "array": high[name] - bars, "arrayminus": bars - low[name]}
        fig.add_bar(x=list(by_workflow.index), y=bars, name=name, marker_color=PALETTE[k % len(PALETTE)],
                    error_y=error)
    fig.update_yaxes(title="test accuracy", range=[0, 1])
    fig.update_xaxes(title="workflow")
    return fig.update_layout(template=TEMPLATE, barmode="group", title="Where each model is strong: accuracy by workflow")


def training_curves(history) -> go.Figure:
    """Held-out loss over the run: the L2 search of the heads, then the fine-tuning steps if any (top axis)."""
    heads = history[history["stage"] == "heads"]
    fig = go.Figure()
    for l2, group in heads.groupby("l2"):
        fig.add_scatter(x=group["step"], y=group["val_loss"], mode="lines", name=f"heads, L2={l2:g} (dev)")
    tuned = history[history["stage"] != "heads"]
    if len(tuned):
        dev = tuned.dropna(subset=["val_loss"])
        fig.add_scatter(x=dev["step"], y=dev["val_loss"], mode="lines+markers", xaxis="x2",
                        name=f"{tuned['stage'].iloc[0]} fine-tuning (dev)")
        fig.update_layout(xaxis2={"overlaying": "x", "side": "top", "title": "fine-tuning step"})
    return fig.update_layout(template=TEMPLATE, title="Training curves", xaxis_title="full-batch step (heads)",
                             yaxis_title="soft cross-entropy")


def memory_bars(comparison) -> go.Figure:
    """Estimated peak training memory per backbone, stacked by term, with the quoted figures as markers."""
    fig = go.Figure()
    names = [e.shape.name for e in comparison.estimates]
    for term in comparison.estimates[0].terms:
        fig.add_bar(x=names, y=[e.terms[term] for e in comparison.estimates], name=term)
    quoted = [(name, low, high) for name, (low, high) in comparison.references.items() if name in names]
    if quoted:
        middle = [(low + high) / 2 for _, low, high in quoted]
        fig.add_scatter(x=[n for n, _, _ in quoted], y=middle, mode="markers", name="quoted figure",
                        error_y={"type": "data", "array": [h - m for (_, _, h), m in zip(quoted, middle)]},
                        marker={"symbol": "diamond", "size": 14, "color": "black"})
    return fig.update_layout(barmode="stack", template=TEMPLATE, yaxis_title="GB",
                             title="Estimated peak memory of a QLoRA decision-model training step")


def reliability_diagram(tables: dict, title: str = "Reliability") -> go.Figure:
    """Accuracy against mean confidence per bin, one line per stage (before / after), each bin with its accuracy's
    interval (``metrics.reliability_bins``' columns), and the diagonal."""
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                    line={"dash": "dash", "color": "grey"})
    for stage, table in tables.items():
        fig.add_scatter(x=table["confidence"], y=table["accuracy"], mode="lines+markers", name=stage,
                        marker={"size": 6 + 14 * (table["decisions"] / table["decisions"].max())},
                        error_y={"type": "data", "symmetric": False, "thickness": 1,
                                 "array": table["accuracy high"] - table["accuracy"],
                                 "arrayminus": table["accuracy"] - table["accuracy low"]},
                        customdata=table[["decisions"]], hovertemplate="confidence %{x:.2f}<br>accuracy %{y:.2f}"
                        "<br>%{customdata[0]} decisions")
    return fig.update_layout(template=TEMPLATE, title=title, xaxis_title="mean confidence of the top answer",
                             yaxis_title="accuracy", xaxis_range=[0, 1], yaxis_range=[0, 1])


def confidence_histogram(decisions: dict, title: str = "Top-answer confidence") -> go.Figure:
    """How the top answer's confidence is spread, one histogram per stage."""
    fig = go.Figure()
    for stage, frame in decisions.items():
        fig.add_histogram(x=frame["confidence"], name=stage, opacity=0.6, xbins={"start": 0, "end": 1, "size": 0.05})
    return fig.update_layout(template=TEMPLATE, title=title, barmode="overlay", xaxis_title="confidence",
                             yaxis_title="decisions")


def risk_coverage_curve(curves: dict, title: str = "Risk-coverage") -> go.Figure:
    """Accuracy of the decisions kept against the share kept, as the confidence threshold rises."""
    fig = go.Figure()
    for stage, curve in curves.items():
        curve = curve.iloc[::max(1, len(curve) // 400)]  # a smooth line needs a few hundred points, not thousands
        fig.add_scatter(x=curve["coverage"], y=curve["accuracy"], mode="lines", name=stage,
                        customdata=curve[["threshold"]], hovertemplate="coverage %{x:.2f}<br>accuracy %{y:.3f}"
                        "<br>threshold %{customdata[0]:.3f}")
    return fig.update_layout(template=TEMPLATE, title=title, xaxis_title="share of decisions answered (coverage)",
                             yaxis_title="accuracy of the answered decisions", yaxis_range=[0, 1])


def score_distributions(scores, score: str, threshold: float | None = None, human_below: bool = False) -> go.Figure:
    """One anomaly score's spread per set of inputs (in-domain, off-domain, near-domain), with the threshold;
    ``human_below``: inputs below it (rather than above) go to a human."""
    fig = px.violin(scores, x="set", y=score, color="set", box=True, points="all", hover_data=["id", "kind"],
                    template=TEMPLATE, title=f"Anomaly score '{score}' by input set")
    if threshold is not None:
        fig.add_hline(y=threshold, line_dash="dash",
                      annotation_text=f"threshold: {'below' if human_below else 'above'} goes to a human")
    # spanmode "hard": each violin ends at its set's extreme values, so the density never spills past what the
    # score can take (a confidence above 1, a distance below 0)
    fig.update_traces(spanmode="hard")
    return fig.update_layout(showlegend=False, xaxis_title="input set", yaxis_title=f"{score} (one point per input)")


def answer_bars(answers: dict, title: str = "Probability of each option, one panel per question") -> go.Figure:
    """Every answer's probabilities (System One shape) as horizontal bars, one panel per question."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(answers), cols=1, subplot_titles=list(answers), vertical_spacing=0.12)
    for row, (qid, a) in enumerate(answers.items(), 1):
        table = answer_probabilities(a)
        fig.add_bar(x=list(table.values()), y=list(table), orientation="h", name=qid, showlegend=False,
                    text=[f"{p:.1%}" for p in table.values()], row=row, col=1)
        fig.update_xaxes(title={"text": "probability", "standoff": 4}, range=[0, 1], tickformat=".0%", row=row, col=1)
        fig.update_yaxes(title="option", row=row, col=1)
    return fig.update_layout(template=TEMPLATE, title=title, height=140 * len(answers) + 60,
                             margin={"t": 80, "l": 150}, uniformtext={"minsize": 11, "mode": "show"})


LOG_STEPS = ((1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1,))  # tick mantissas for a log axis, finest first
MAX_TICKS = 10


def log_ticks(values) -> dict:
    """Tick values and labels for a log axis over ``values``, each labelled in full (plotly labels a log axis's
    minor ticks "2", "3", ... without their power of ten, which reads 300 ms as 3): the finest of ``LOG_STEPS``
    times a power of ten that puts between two and ``MAX_TICKS`` ticks within the values, or the two ends, rounded,
    where none does."""
    positive = [float(v) for v in values if v > 0 and math.isfinite(v)]
    if not positive:
        return {}
    low, high = min(positive), max(positive)
    decades = range(math.floor(math.log10(low)), math.floor(math.log10(high)) + 1)
    for steps in LOG_STEPS:
        ticks = [round(m * 10.0 ** e, 12) for e in decades for m in steps if low <= m * 10.0 ** e <= high]
        if 2 <= len(ticks) <= MAX_TICKS:
            break
    else:
        ticks = sorted({float(f"{v:.3g}") for v in (low, high)})
    return {"tickvals": ticks, "ticktext": [f"{t:,.10g}" for t in ticks]}


def latency_boxes(timings, title: str = "Latency per request", axis: str = "what was timed") -> go.Figure:
    """One box per timed thing (named on the ``axis``), every sample shown, on a log axis (generation and a forward
    pass differ 10x+)."""
    fig = go.Figure()
    for t in timings:
        fig.add_box(y=t.samples_ms, name=t.name, boxpoints="all", jitter=0.4, pointpos=0)
    fig.update_yaxes(**log_ticks([v for t in timings for v in t.samples_ms]))
    return fig.update_layout(template=TEMPLATE, title=title, xaxis_title=axis,
                             yaxis_title="milliseconds per call (log scale)", yaxis_type="log", showlegend=False)


def scaling_lines(scalings, title: str = "Cost of one more question") -> go.Figure:
    """Milliseconds against the number of questions asked about one input, with each fitted slope, on log axes
    (heads take microseconds, a forward pass hundreds of milliseconds)."""
    fig = go.Figure()
    for k, s in enumerate(scalings):
        fig.add_scatter(x=s.counts, y=s.ms, mode="lines+markers", name=f"{s.name}: {s.slope_ms:.3g} ms per question",
                        line_color=PALETTE[k % len(PALETTE)])
    counts = sorted({c for s in scalings for c in s.counts})
    fig.update_xaxes(tickvals=counts, ticktext=[f"{c:g}" for c in counts])  # the counts asked, nothing between
    fig.update_yaxes(**log_ticks([v for s in scalings for v in s.ms]))
    return fig.update_layout(template=TEMPLATE, title=title, xaxis_title="questions about one input (log scale)",
                             yaxis_title="milliseconds per input, median (log scale)", xaxis_type="log",
                             yaxis_type="log", legend={"orientation": "h", "y": -0.2})


def load_curves(table) -> go.Figure:
    """Requests per second and p99 latency against concurrent clients, one line per max batch size, in the same
    colour in both panels (one legend entry each); throughput from zero."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput", "p99 latency"))
    for k, (size, group) in enumerate(table.groupby(level="max batch")):
        name = "one request per forward" if size == 1 else f"batched (up to {size})"
        clients = group.index.get_level_values("clients")
        color = PALETTE[k % len(PALETTE)]
        fig.add_scatter(x=clients, y=group["requests/s"], mode="lines+markers", name=name, legendgroup=name,
                        line_color=color, row=1, col=1)
        fig.add_scatter(x=clients, y=group["p99 ms"] / 1e3, mode="lines+markers", name=name, legendgroup=name,
                        line_color=color, showlegend=False, row=1, col=2)
    clients = sorted(set(table.index.get_level_values("clients")))
    fig.update_xaxes(type="log", title_text="concurrent clients (log scale)", tickvals=clients,
                     ticktext=[str(c) for c in clients])
    fig.update_yaxes(title_text="requests / s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="seconds", rangemode="tozero", row=1, col=2)
    return fig.update_layout(template=TEMPLATE, title="Serving on loopback: batching on and off")


def review_curve(table) -> go.Figure:
    """Notebook 11: per round of the loop, accuracy and the share sent to a human on held-out claims of the new
    kind, against the reviewed cases trained on (``loop_lab.Curve.table()``)."""
    fig = go.Figure()
    for column in ("accuracy", "sent to a human"):
        fig.add_scatter(x=table["reviews used"], y=table[column], mode="lines+markers", name=column)
    fig.update_xaxes(title="reviewed new-kind cases trained on", tickvals=list(table["reviews used"]))
    fig.update_yaxes(title="share of the held-out new-kind claims", range=[0, 1])
    return fig.update_layout(template=TEMPLATE, title="What the reviews bought, on held-out home-office claims")
