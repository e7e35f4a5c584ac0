"""Write ``decisionkit/scenario_data/expenses/claims.csv``: 500 labelled expense claims of a fictional company.

The command line over the generator, ``decisionkit.data.expense_claims`` (where the rules, the templates and the
drift kind of claim live): running ``python scripts/make_expense_claims.py`` rewrites the file byte for byte the
same; ``--claims N --out PATH`` writes a scaled copy (``benchmarks/own_data.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from decisionkit.data.expense_claims import N_CLAIMS, N_LONG, OUT, write_claims


def main() -> None:
    parser = argparse.ArgumentParser(description="write the expenses scenario's claims (or a scaled copy)")
    parser.add_argument("--claims", type=int, default=N_CLAIMS, help=f"claims to write (default {N_CLAIMS})")
    parser.add_argument("--long", type=int, default=None, help=f"claims with an e-mail thread (default {N_LONG} "
                                                                   "in 500: 3%%)")
    parser.add_argument("--out", type=Path, default=OUT, help="the CSV to write (default: the scenario's)")
    args = parser.parse_args()
    long_claims = args.long if args.long is not None else round(N_LONG * args.claims / N_CLAIMS)
    print(f"wrote {write_claims(args.out, args.claims, long_claims)} claims to {args.out}")


if __name__ == "__main__":
    main()
