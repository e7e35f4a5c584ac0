"""The ``decisionkit`` command line.

- ``decisionkit demo``: the README's main job. Train the hybrid on the full train split (``cpu-fast``: heads on
  frozen MiniLM-L6 features averaged with trees on the state's fields), calibrate it on validation, fit the routing
  threshold, evaluate on test (and the off-domain set), score the zero-shot baseline on a validation sample, and
  write ``runs/demo/`` (model, report.json, report.md).
- ``decisionkit train --data PATH [--schema FILE] [--preset NAME] --out DIR``: the same on your own decisions (a CSV,
  TSV, JSONL, JSON or parquet file, or a folder, in any shape an export has: the reading flags ``READING``;
  ``decisionkit.train(data, out=..., schema=..., preset=..., **reading)`` is the same code), written to DIR only once
  it is whole, and never into a folder of other files. ``decisionkit evaluate DIR``: the saved model on the test
  rows it kept (``--data`` scores other data, leaving out the rows it trained on; ``--split`` another of its splits).
- ``decisionkit predict DIR --data FILE --out answers.jsonl|.csv``: answers for a file of new rows;
  ``decisionkit export DIR DEST``: the model alone, without the rows it was trained on.
- ``decisionkit pooling``: the pooling comparison of notebook 01 on a sample.
- ``decisionkit decide RUN < request.json`` and ``decisionkit serve RUN``: the System One API (see ``serving/app.py``).

A user's mistake (``core.errors.UserError``: bad data, a folder that must not be written, a missing extra) is one line
and exit status 2; anything else is a bug and shows its traceback (``DECISIONKIT_DEBUG=1``: every error does).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ._version import __version__
from .core import settings
from .core.atomic import write_text
from .core.errors import UserError
from .core.extras import needs_extra
from .loop import AUDIT_SHARE
from .serving.config import Batching, Limits

# Parsing the command line imports nothing heavy (no torch, pandas or safetensors: `decisionkit --help` answers at
# once, and a machine with the core install alone can ask it); each command imports what it runs.

# how an export's columns are read (``data.rows.Reading``): flag -> help
READING = {
    "workflow": "the workflow of rows that name none (default: 'decisions'; never the file's name, so renaming the "
                "export changes nothing)",
    "state_columns": "build the state from these columns, a,b,c (default: the 'state' or 'text' column, else every "
                     "column that is not an id, workflow, split or label)",
    "text_column": "read this column as the state, as text",
    "id_column": "the column of the rows' ids (default: 'id'; with none, each row's id is a hash of its state)",
    "ignore_columns": "columns to leave out, a,b",
    "delimiter": "a CSV's delimiter (default: found from its rows among , ; tab |)",
}

# what `train` can shrink in a preset, and how each option says it
SIZES = {"train_per_workflow": "train cases per workflow", "validation_per_workflow": "validation cases per workflow",
         "test_per_workflow": "test cases per workflow the report scores",
         "head_steps": "head fitting steps per L2 strength"}


def _write_json(path: Path, payload: dict) -> None:
    write_text(path, json.dumps(payload, indent=2, default=str, ensure_ascii=False))


def reading_of(args) -> dict:
    """The reading flags given (``rows.Reading``: how an export's columns are read) as keyword arguments."""
    return {name: getattr(args, name) for name in READING if getattr(args, name, None) is not None}


def run_training(args):
    """The train / demo commands: ``pipeline.train`` with the command's options, printed as it goes."""
    from .training.pipeline import train
    from .training.presets import DEFAULT_PRESET, preset
    from .training.run_folder import check_out
    from .training.trainer import decisions_of

    sizes = {name: getattr(args, name) for name in SIZES if getattr(args, name, None) is not None}
    if getattr(args, "reviews", None):  # the served model's own recipe unless --preset
        from .loop.retrain import train_with_reviews

        return train_with_reviews(args.data, args.reviews, args.out, schema=args.schema, preset=args.preset,
                                  served=args.served, overrides=sizes, progress=not args.quiet,
                                  **reading_of(args)).report
    args.preset = args.preset or DEFAULT_PRESET
    p = preset(args.preset, **sizes)
    check_out(args.out)  # before the data is read: a folder of the user's files is refused at once
    data = decisions_of(p, args.data, getattr(args, "schema", None), **reading_of(args))  # read and checked first
    print(f"data: {data.summary()}")
    print(f"training preset {args.preset}{''.join(f', {k}={v}' for k, v in sizes.items())} into {args.out}")
    return train(data, args.out, preset=p, zero_shot=args.zero_shot, resume=not args.restart,
                 progress=not args.quiet).report


def cmd_train(args) -> int:
    report = run_training(args)
    print(report.card())
    print(f"\nwrote {args.out}/ (the model; data.json, rows.json and test.jsonl: what it was trained on and its test "
          f"rows; report.json, report.md); serve it with `decisionkit serve {args.out}`, ship it without your rows "
          f"with `decisionkit export {args.out} DEST`")
    return 0


def cmd_demo(args) -> int:
    started = time.perf_counter()
    report = run_training(args)
    print("\n" + report.card())
    print(f"\nwrote {args.out}/ (model, report.json, report.md) in {time.perf_counter() - started:.0f} s")
    return 0


def cmd_evaluate(args) -> int:
    from .training.evaluation import evaluate

    scores = evaluate(args.run, args.split, args.data, args.schema, **reading_of(args))
    print(f"{args.run}: {scores.note()}; {len(scores.decisions)} decisions")
    print(f"the model {scores.answered_line()}")
    print(scores.summary().round(4).to_string())
    print(scores.summary("type").round(4).to_string())
    out = Path(args.run).expanduser() / scores.output_name
    _write_json(out, {"split": args.split, "data": str(args.data) if args.data else "recorded",
                      "scored": scores.scored, "rows": scores.rows, "left out": scores.left_out,
                      **{k: float(v) for k, v in scores.overall().items()}, "answered": scores.answered})
    print(f"wrote {out}")
    return 0


def cmd_predict(args) -> int:
    from .model.predict import check_output, predict, write_predictions

    check_output(args.out, args.overwrite)  # before any answer: a file that is there stays unless --overwrite
    frame = predict(args.run, args.data, skip_bad=args.skip_bad, batch_size=args.batch_size,
                    progress=not args.quiet, **reading_of(args))
    for row in frame.attrs["skipped"]:
        print(f"skipped {row['where']}: {row['error']}", file=sys.stderr)
    path = write_predictions(frame, args.out, overwrite=args.overwrite)
    routed = f"; {int((frame['verdict'] == 'human').sum())} routed to a human" if "verdict" in frame else ""
    print(f"answered {len(frame)} rows of {args.data}{routed}; skipped {len(frame.attrs['skipped'])}; wrote {path}")
    return 0


def cmd_export(args) -> int:
    from .model.saving import export

    dest = export(args.run, args.dest)
    print(f"wrote {dest}/: the model alone, without the rows it was trained on; load it or serve it as the run")
    return 0


def cmd_pooling(args) -> int:
    from .course.probe import pooling_comparison
    from .data.cases import load_typed_decisions
    from .model.backbone import load_backbone

    backbone = load_backbone(args.backbone)
    per_workflow = args.per_workflow or (10 if settings.quick_mode() else 40)
    train_split = load_typed_decisions("train", args.data).head(per_workflow)
    validation = load_typed_decisions("validation", args.data).head(max(1, per_workflow // 2))
    print(f"backbone {backbone.name} ({backbone.resolved.source}); {len(train_split)} train / {len(validation)} "
          f"validation cases")
    table = pooling_comparison(backbone, train_split, validation,
                               max_length=args.max_length,
                               **({"steps": args.head_steps} if args.head_steps else {})).table()
    print(table.to_string())
    _write_json(Path(args.out) / "pooling.json", {"probes": table.reset_index().to_dict(orient="records"),
                                                  "train_cases": len(train_split), "validation_cases": len(validation)})
    return 0


def cmd_decide(args) -> int:
    from pydantic import ValidationError

    from .contract.systemone import Refusal, SystemOneRequest, prepare, respond
    from .model.decision_model import load

    models = {Path(args.run).name: load(args.run)}
    try:
        request = SystemOneRequest.model_validate_json(sys.stdin.buffer.read())
    except ValidationError as err:
        output: dict | Refusal = Refusal([{**e, "loc": ["body", *e["loc"]]} for e in err.errors(include_url=False)])
    else:
        [output] = respond(models, [prepare(models, request)])
    refused = isinstance(output, Refusal)
    print(json.dumps({"detail": output.detail} if refused else output, indent=2, ensure_ascii=False, default=str))
    return 2 if refused else 0


def _loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def cmd_serve(args) -> int:
    from .serving.app import serve

    api_key = args.api_key or settings.api_key(args.api_key_file)  # never printed, nor logged
    if args.api_key:  # kept for scripts that pass it so
        print("warning: --api-key shows the key in the process list, to every user of this machine; pass it in "
              f"${settings.API_KEY_ENV} or a file (--api-key-file)", file=sys.stderr, flush=True)
    elif args.api_key_file and os.name == "posix" and Path(args.api_key_file).expanduser().stat().st_mode & 0o004:
        print(f"warning: every user of this machine may read {args.api_key_file}; chmod 600 it", file=sys.stderr,
              flush=True)
    if not api_key and not _loopback(args.host):
        print(f"warning: serving on {args.host} without an API key: anyone who reaches the port may call it "
              f"(${settings.API_KEY_ENV} or --api-key-file)", file=sys.stderr, flush=True)

    limits = Limits(**{name: getattr(args, name) for name in asdict(Limits())})
    log = None
    if args.log:  # opened and checked before anything starts: a log that cannot be used stops here, in one line
        from .loop.log import DecisionLog

        log = DecisionLog(args.log, audit_share=args.audit_share)
    kept = (f"; every answer kept in {log.shown} (reviews at /v1/reviews, the page at /review; "
            f"{args.audit_share:.0%} audited)" if log else "")
    print(f"serving {', '.join(args.runs)} on http://{args.host}:{args.port} (POST /v1/systemone, GET /v1/models, "
          f"GET /health, docs at /docs){'; API key required' if api_key else ''}{kept}; Ctrl-C or SIGTERM stops, "
          "SIGHUP reloads a promoted model", flush=True)
    serve(args.runs, args.host, args.port, Batching(args.max_batch_size, args.batch_timeout), limits,
          api_key=api_key, log=log)
    return 0


def cmd_review(args) -> int:
    from .serving.review_routes import review

    api_key = settings.api_key(args.api_key_file)
    if not api_key and not _loopback(args.host):
        print(f"warning: reviewing on {args.host} without an API key: anyone who reaches the port reads the states "
              f"and answers them (${settings.API_KEY_ENV} or --api-key-file)", file=sys.stderr, flush=True)
    review(args.log, args.host, args.port, api_key)
    return 0


def cmd_promote(args) -> int:
    from .loop.retrain import promote

    print(promote(args.run, args.over).line())
    return 0


def add_reading(sub) -> None:
    """The reading flags (``READING``) on a command that reads an export."""
    for name, help_text in READING.items():
        sub.add_argument(f"--{name.replace('_', '-')}", default=None, metavar="NAME" if "column" in name else None,
                         help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decisionkit", description="Decision models: train, evaluate, demo.")
    parser.add_argument("--version", action="version", version=f"decisionkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub, out_default=None):
        sub.add_argument("--data", default=None, help=f"typed-decisions folder (default: ${settings.DATA_ENV} or hub)")
        if out_default is not None:
            sub.add_argument("--out", default=out_default, help="output folder")

    for name, handler, help_text in (
            ("demo", cmd_demo, "the main job: train, calibrate, fit the router, evaluate; runs/demo"),
            ("train", cmd_train, "train on your own decisions (or a preset's dataset), calibrate, route, evaluate")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--preset", default=None, metavar="NAME",
                         help="what to train, a name of decisionkit.PRESETS (default: the main job's hybrid, "
                              "heads on MiniLM-L6 features averaged with trees on a JSON state's fields)")
        if name == "train":
            sub.add_argument("--data", default=None, metavar="PATH",
                             help="your decisions: a .csv, .tsv, .jsonl, .json or .parquet file (gzipped too), or a "
                                  "folder (schema.json and one examples file, or train.jsonl and test.jsonl); "
                                  "scenario:NAME for a project scenario; default: the preset's own dataset "
                                  f"(typed-decisions from ${settings.DATA_ENV} or the hub)")
            add_reading(sub)
            sub.add_argument("--schema", default=None, metavar="FILE",
                             help="the questions as System One JSON, {question: {...}} or {workflow: {question: ...}}"
                                  " (default: the folder's schema.json, or each row's questions)")
            sub.add_argument("--out", required=True,
                             help="folder for the model, its data record and its report: a new or empty folder, or "
                                  "an earlier model's (only its own files are replaced); any other folder is refused")
            sub.add_argument("--reviews", default=None, metavar="PATH_OR_URL",
                             help="a decision log (decisionkit serve --log): train on its reviewed cases too, with "
                                  "the served model's recipe unless --preset, and compare with that model")
            sub.add_argument("--served", default=None, metavar="RUN",
                             help="with --reviews: the model that served them (default: the folder the log names)")
            for size, help_text in SIZES.items():
                sub.add_argument(f"--{size.replace('_', '-')}", type=int, metavar="N",
                                 help=f"{help_text} (default: the preset's)")
        else:
            common(sub, "runs/demo")
        sub.add_argument("--zero-shot", type=int, default=5 if name == "demo" else 0, metavar="N",
                         help="also score the zero-shot baseline on N validation cases per workflow (0: skip)")
        sub.add_argument("--restart", action="store_true", help="ignore a checkpoint left by an interrupted run")
        sub.add_argument("--quiet", action="store_true", help="no progress bars")
        sub.set_defaults(handler=handler)

    sub = commands.add_parser("evaluate", help="score a saved model: the test rows it kept, or other data")
    sub.add_argument("run", help="folder of a saved model")
    sub.add_argument("--split", default="test", choices=["train", "validation", "test"],
                     help="which split (default test; validation and train are read again from the recorded source)")
    sub.add_argument("--data", default=None, metavar="PATH",
                     help="score other data instead: any source `train --data` reads, or scenario:NAME; its "
                          "--split when its rows name splits, else every row; rows the model trained or calibrated "
                          "on are left out, and counted")
    sub.add_argument("--schema", default=None, metavar="FILE", help="the questions of --data (default: the model's)")
    add_reading(sub)
    sub.set_defaults(handler=cmd_evaluate)

    sub = commands.add_parser("predict", help="answer a file of new rows: a JSONL or CSV of answers and verdicts")
    sub.add_argument("run", help="folder of a saved model")
    sub.add_argument("--data", required=True, metavar="PATH",
                     help="the rows to answer, in any shape `train --data` reads (labels not needed)")
    sub.add_argument("--out", required=True, metavar="FILE",
                     help="answers.jsonl ({id, answers, routing} a line) or answers.csv (a column per answer field)")
    add_reading(sub)
    sub.add_argument("--skip-bad", action="store_true",
                     help="leave out a row that cannot be answered, and name it (default: refuse before any answer)")
    sub.add_argument("--overwrite", action="store_true", help="write over --out if it exists")
    sub.add_argument("--batch-size", type=int, default=16, metavar="N", help="states per forward pass")
    sub.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.set_defaults(handler=cmd_predict)

    sub = commands.add_parser("export", help="write a run's model alone, without the rows it was trained on")
    sub.add_argument("run", help="folder of a trained run")
    sub.add_argument("dest", help="a new folder for the model")
    sub.set_defaults(handler=cmd_export)

    sub = commands.add_parser("decide", help="answer one System One request read from standard input")
    sub.add_argument("run", help="folder of a saved model")
    sub.set_defaults(handler=cmd_decide)

    sub = commands.add_parser("serve", help="serve saved models over HTTP: POST /v1/systemone, GET /v1/models, "
                                            "GET /health")
    sub.add_argument("runs", nargs="+", help="folders of saved models; each is served under its folder's name")
    sub.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sub.add_argument("--port", type=int, default=8000)
    keys = sub.add_mutually_exclusive_group()
    keys.add_argument("--api-key-file", default=None, metavar="PATH",
                      help="ask every request for Authorization: Bearer KEY, KEY being the first line of PATH "
                           f"(default: ${settings.API_KEY_ENV}; unset, none is asked: keep the server on loopback)")
    keys.add_argument("--api-key", default=None, metavar="KEY",
                      help="the same with KEY itself, which every user of this machine then reads in the process "
                           "list: kept for compatibility, warned about")
    batching, limits = Batching(), Limits()
    sub.add_argument("--max-batch-size", type=int, default=batching.max_batch_size,
                     help="requests per forward pass (1: no batching)")
    sub.add_argument("--batch-timeout", type=float, default=batching.timeout,
                     help="seconds to wait for a batch to fill")
    for name, value in asdict(limits).items():
        sub.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value,
                         help=f"see decisionkit.serving.config.Limits (default {value})")
    sub.add_argument("--log", default=None, metavar="PATH_OR_URL",
                     help="keep every answer, and queue for review what goes to a human: a SQLite file path, or a "
                          "database URL (postgresql+psycopg://user@host/db) several servers may share")
    sub.add_argument("--audit-share", type=float, default=AUDIT_SHARE, metavar="SHARE",
                     help=f"with --log, the share of answered requests also queued for review at random (default "
                          f"{AUDIT_SHARE})")
    sub.set_defaults(handler=cmd_serve)

    sub = commands.add_parser("review", help="the review page and /v1/reviews over a decision log, no model loaded")
    sub.add_argument("log", metavar="PATH_OR_URL", help="the decision log (decisionkit serve --log)")
    sub.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sub.add_argument("--port", type=int, default=8001)
    sub.add_argument("--api-key-file", default=None, metavar="PATH",
                     help=f"ask every call for Authorization: Bearer KEY, KEY the first line of PATH (default: "
                          f"${settings.API_KEY_ENV}; the page asks for it)")
    sub.set_defaults(handler=cmd_review)

    sub = commands.add_parser("promote", help="serve RUN under the name of the model it was compared with, if it is "
                                              "not worse (a server takes it on SIGHUP)")
    sub.add_argument("run", help="the new model's run folder (decisionkit train --reviews)")
    sub.add_argument("--over", required=True, metavar="RUN", help="the run folder the server was started with")
    sub.set_defaults(handler=cmd_promote)

    sub = commands.add_parser("pooling", help="compare poolings and layers with linear probes on a sample")
    sub.add_argument("--backbone", default=None, help="hub id or local folder (default: offline SmolLM2-135M)")
    sub.add_argument("--per-workflow", type=int, default=None, help="train cases per workflow (default 40)")
    sub.add_argument("--max-length", type=int, default=512,
                     help="the window, in tokens: a longer state is read in windows of it (at most 8)")
    sub.add_argument("--head-steps", type=int, default=None, metavar="N",
                     help="probe fitting steps per L2 strength (default: the probe's)")
    common(sub, "runs/pooling")
    sub.set_defaults(handler=cmd_pooling)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False):  # every bar, the feature extraction of scoring and routing included
        os.environ["TQDM_DISABLE"] = "1"
    try:
        with needs_extra(f"decisionkit {args.command}"):
            return args.handler(args)
    except BrokenPipeError:  # whoever read the output stopped (`| head`): nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (UserError, PermissionError) as err:  # a user's mistake (or a folder they may not write): one line
        if settings.debug():
            raise
        print(f"decisionkit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
