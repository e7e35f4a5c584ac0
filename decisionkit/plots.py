"""Every figure of the course, built with plotly. Functions return a figure; they never call ``.show()``."""

from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go

TEMPLATE = "plotly_white"


def length_histogram(stats) -> go.Figure:
    """Token lengths of a split's rendered states, one colour per workflow."""
    fig = px.histogram(x=stats.lengths, color=stats.workflows, nbins=40, barmode="overlay", opacity=0.6,
                       labels={"x": "tokens per rendered state", "color": "workflow"}, template=TEMPLATE,
                       title=f"Token lengths ({stats.split} split)")
    return fig.update_layout(yaxis_title="cases")


def probe_bars(comparison) -> go.Figure:
    """Validation accuracy per question type for each probe setting."""
    table = comparison.table()
    columns = {c: c.replace("accuracy", "").strip() or "all" for c in table.columns if c.startswith("accuracy")}
    long = (table[list(columns)].rename(columns=columns).reset_index()
            .melt(id_vars="probe", var_name="decisions", value_name="accuracy"))
    fig = px.bar(long, x="decisions", y="accuracy", color="probe", barmode="group", template=TEMPLATE,
                 title="Linear probe on frozen features: validation accuracy", text_auto=".2f")
    return fig.update_layout(yaxis_range=[0, 1])


def training_curves(history) -> go.Figure:
    """Validation (and training) loss over the run: the L2 search of the heads, then LoRA epochs if any."""
    heads = history[history["stage"] == "heads"]
    fig = go.Figure()
    for l2, group in heads.groupby("l2"):
        fig.add_scatter(x=group["step"], y=group["val_loss"], mode="lines", name=f"heads, L2={l2:g} (validation)")
    lora = history[(history["stage"] == "lora")] if "epoch" in history else history.iloc[0:0]
    if len(lora):
        val = lora.dropna(subset=["val_loss"])
        fig.add_scatter(x=val["epoch"], y=val["val_loss"], mode="lines+markers", name="LoRA epochs (validation)",
                        xaxis="x2")
        fig.update_layout(xaxis2={"overlaying": "x", "side": "top", "title": "LoRA epoch"})
    return fig.update_layout(template=TEMPLATE, title="Training curves", xaxis_title="full-batch step (heads)",
                             yaxis_title="soft cross-entropy")
