"""`bertbench evaluate-squad DATA.json PREDICTIONS.json`: SQuAD exact match and F1 with the official definitions.

The same arguments as the official evaluate-v2.0.py (which also scores v1.1 files, with v1.1's figures): a v2.0
file adds the HasAns/NoAns breakdown, and with --na-prob-file the best no-answer threshold. Prints the figures as
JSON; a question without a prediction scores 0 with a warning on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from bertbench.common.errors import run_command
from bertbench.common.flags import ArgumentParser
from bertbench.tasks.squad.reading import SquadDataError
from bertbench.tasks.squad.scoring import evaluate, read_predictions, read_questions

PROGRAM = "bertbench evaluate-squad"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0])
    parser.add_argument("data_file", help="SQuAD dev file (dev-v1.1.json or dev-v2.0.json).")
    parser.add_argument("pred_file", help="predictions.json: question id -> answer text.")
    parser.add_argument("--out-file", "-o", help="Also write the figures as JSON here.")
    parser.add_argument("--na-prob-file", "-n", help="null_odds.json: question id -> no-answer probability (v2.0).")
    parser.add_argument(
        "--na-prob-thresh",
        "-t",
        type=float,
        default=1.0,
        help="Predict no answer when the no-answer probability is above this (default: 1.0).",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> None:
        args = parse_args(argv)
        questions, version_2 = read_questions(args.data_file)
        predictions = read_predictions(args.pred_file)
        probabilities = read_predictions(args.na_prob_file, float) if args.na_prob_file else None
        figures = evaluate(
            questions,
            predictions,
            version_2,
            probabilities,
            args.na_prob_thresh,
            warn=lambda message: print(message, file=sys.stderr),
        )
        text = json.dumps(figures, indent=2)
        print(text)
        if args.out_file:
            with open(args.out_file, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")

    return run_command(PROGRAM, body, input_errors=(SquadDataError,))


if __name__ == "__main__":
    sys.exit(main())
