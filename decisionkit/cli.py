"""The ``decisionkit`` command line.

``decisionkit demo`` is the README's main job: resolve the backbone (offline by default), load typed-decisions,
extract pooled features for a sample of each split, and print the pooling comparison it measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

from . import __version__, settings
from .backbone import BackboneError, load_backbone
from .data import DataError, load_typed_decisions, token_lengths
from .probe import pooling_comparison


def _write_json_atomic(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(path.suffix + ".tmp")
    scratch.write_text(json.dumps(payload, indent=2))
    scratch.replace(path)


def demo(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    per_workflow = args.per_workflow or (10 if settings.quick_mode() else 40)
    print(f"decisionkit {__version__} · torch {torch.__version__} · transformers {transformers.__version__} · "
          f"{torch.get_num_threads()} threads")
    backbone = load_backbone(args.backbone)
    print(f"backbone: {backbone.name} ({backbone.resolved.source}), {backbone.num_layers} layers, "
          f"hidden {backbone.hidden_size}, weights sha256 {backbone.checksum[:16]}…")
    train = load_typed_decisions("train", args.data).head(per_workflow)
    validation = load_typed_decisions("validation", args.data).head(per_workflow // 2 or 1)
    print(f"data: {train.source} · sample of {len(train)} train / {len(validation)} validation cases")
    lengths = token_lengths(train, backbone.tokenizer).table().loc["all"]
    print(f"tokens per state: median {lengths['median']:.0f}, p95 {lengths['p95']:.0f}, max {lengths['max']:.0f}")
    comparison = pooling_comparison(backbone, train, validation, max_length=args.max_length)
    table = comparison.table()
    print("\nLinear probe on frozen features (validation sample):")
    print(table.to_string())
    best = comparison.best()
    seconds = time.perf_counter() - started
    print(f"\nbest: {best.name} at {best.scores.overall()['accuracy']:.3f} accuracy on {len(validation)} "
          f"validation cases ({len(validation) * 5} decisions); wall time {seconds:.0f} s")
    report = {
        "decisionkit": __version__,
        "backbone": {"name": backbone.name, "source": backbone.resolved.source,
                     "weights_sha256": backbone.checksum, "layers": backbone.num_layers},
        "data": {"source": train.source, "train_cases": len(train), "validation_cases": len(validation)},
        "max_length": args.max_length,
        "probes": table.reset_index().to_dict(orient="records"),
        "wall_seconds": seconds,
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads()},
    }
    out = Path(args.out) / "pooling.json"
    _write_json_atomic(out, report)
    print(f"wrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decisionkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"decisionkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("demo", help="the main job: backbone, data, pooled features, pooling comparison")
    run.add_argument("--backbone", default=None, help="hub id or local folder (default: offline SmolLM2-135M)")
    run.add_argument("--data", default=None, help=f"typed-decisions folder (default: ${settings.DATA_ENV} or hub)")
    run.add_argument("--per-workflow", type=int, default=None,
                     help="train cases per workflow in the sample (default 40; 10 with DECISIONKIT_QUICK=1)")
    run.add_argument("--max-length", type=int, default=512, help="truncate rendered states to this many tokens")
    run.add_argument("--out", default="runs/demo", help="folder for the JSON report")
    run.set_defaults(handler=demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (BackboneError, DataError, FileNotFoundError, ValueError) as err:  # the user's input: no traceback
        print(f"decisionkit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
