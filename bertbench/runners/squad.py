"""Fine-tune BERT on SQuAD v1.1 or v2.0 and predict answers, with Google's run_squad.py flags (also `bertbench squad`).

    python -m bertbench.run_squad --do_train=true --do_predict=true \\
        --train_file=$SQUAD_DIR/train-v1.1.json --predict_file=$SQUAD_DIR/dev-v1.1.json \\
        --vocab_file=$BERT_DIR/vocab.txt --bert_config_file=$BERT_DIR/bert_config.json \\
        --init_checkpoint=$BERT_DIR/bert_model.ckpt --max_seq_length=384 --doc_stride=128 \\
        --train_batch_size=12 --learning_rate=3e-5 --num_train_epochs=2.0 --output_dir=/tmp/squad_base/

HF's run_qa.py command runs too (`python -m bertbench.run_qa`): its --validation_file is predicted and scored by
--do_eval, its --test_file predicted by --do_predict (SquadSettings.from_flags).

Writes to output_dir: checkpoints (ckpt-<step>.pt), metrics.jsonl, train_results.json, and with --do_predict
predictions.json, nbest_predictions.json, null_odds.json (v2.0), and, when the predict file has answers (a dev
file), eval_results.json/.txt with the official exact match and F1 (and HF's eval_* keys, also in
all_results.json). An epoch is one pass over the training windows
(a long context gives several). Under torchrun every process trains its share of each batch and predicts its share
of the windows; rank 0 writes. With --no_sync_gradients the processes train apart and the one whose predictions
score the best F1 on the predict file (a dev file, with answers) is kept.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bertbench.common.errors import UsageError
from bertbench.common.flags import setting
from bertbench.common.run_files import SQUAD_NBEST, SQUAD_NULL_ODDS, SQUAD_PREDICTIONS
from bertbench.runners.config import FineTuningSettings
from bertbench.runners.results import report_eval
from bertbench.runners.run_directory import write_json
from bertbench.runners.skeleton import FineTuningData, FineTuningRunner, WorkerScore
from bertbench.tasks.squad.answers import ANSWER_TEXTS, GoogleAnswerText, SquadPredictions, postprocess
from bertbench.tasks.squad.features import ANSWER_SPANS, SquadFeatures, convert_examples
from bertbench.tasks.squad.reading import SquadDataError, SquadExample, read_examples
from bertbench.tasks.squad.scoring import ScoredQuestion, evaluate, read_questions
from bertbench.tasks.tokenization import BertTokenizer
from bertbench.training.loop import Estimator

PROGRAM = "run_squad"


@dataclasses.dataclass(frozen=True)
class SquadSettings(FineTuningSettings):
    """SQuAD: the files, windows and answers (Google's run_squad flags and defaults)."""

    train_file: str | None = setting("SQuAD JSON to train on (train-v1.1.json, train-v2.0.json).", None)
    predict_file: str | None = setting("SQuAD JSON to predict (dev-v1.1.json); scored when it has answers.", None)
    doc_stride: int = setting(
        "Tokens between the starts of a long context's windows.", 128, positive=True, defines_run=True
    )
    max_query_length: int = setting(
        "Question tokens kept; longer questions are cut.", 64, positive=True, defines_run=True
    )
    n_best_size: int = setting(
        "Best start and end logits paired per window, and n-best answers kept.", 20, positive=True
    )
    max_answer_length: int = setting("Longest answer, in tokens.", 30, positive=True)
    version_2_with_negative: bool = setting("SQuAD v2.0: questions may have no answer.", False, defines_run=True)
    keep_unaligned_answers: bool = setting(
        "Train on the questions Google's run_squad skips (\"Could not find "
        'answer"): those whose answer text, split at every Unicode space, is '
        "not found in the context's words split at spaces, tabs and line breaks "
        "only (an answer holding a no-break space). Off: they are skipped, as "
        "Google's reader skips them, with a warning naming them.",
        False,
        defines_run=True,
    )
    train_answer_span: str = setting(
        "Which context tokens a training answer's start and end point at. google: "
        "Google's run_squad's rule, the whole words holding the answer narrowed to the "
        "first run of their tokens that is the answer text's own tokens, else all of "
        "them (with the quote, bracket or rest of a word piece next to an answer that "
        "cuts a piece); the original's targets, for results that compare with its. "
        "characters: the tokens holding the answer's characters, at the place "
        "annotated; tighter targets where answers cut words.",
        "google",
        choices=ANSWER_SPANS,
        defines_run=True,
    )
    null_score_diff_threshold: float = setting(
        'v2.0: answer "" when the no-answer score beats the best span\'s by more than this.', 0.0
    )
    answer_text: str = setting(
        "How an answer's text is made. google: as Google's write_predictions (the span's "
        "original words joined by single spaces, trimmed to the predicted tokens where the "
        "characters align, else the whole words), so predictions files match the original's; "
        "context: the exact characters of the context the span's tokens cover.",
        "google",
        choices=ANSWER_TEXTS,
    )
    do_eval: bool = setting(
        "Score the predictions against --predict_file's answers (NVIDIA's flag: a file with "
        "answers is scored anyway); a file without answers is then an error. With HF's --validation_file: "
        "predict and score that file (HF's meaning).",
        False,
        per_command=True,
    )
    validation_file: str | None = setting(
        "HF run_qa's: the SQuAD JSON --do_eval predicts and scores (--predict_file with --do_predict --do_eval).", None
    )
    test_file: str | None = setting(
        "HF run_qa's: the SQuAD JSON --do_predict predicts (--predict_file); one predicted file per command, so "
        "not with --do_eval's --validation_file.",
        None,
    )

    @classmethod
    def from_flags(cls, fields: Mapping[str, Any]) -> SquadSettings:
        """HF run_qa's files and actions as bertbench's: --do_eval predicts and scores --validation_file, --do_predict
        predicts --test_file, each one the --predict_file of Google's --do_predict."""
        validation, test = fields.get("validation_file"), fields.get("test_file")
        if validation is None and test is None:
            return super().from_flags(fields)
        if fields.get("predict_file") is not None:
            raise UsageError("--predict_file (Google's) or HF's --validation_file/--test_file: give one")
        evaluates, predicts = fields.get("do_eval"), fields.get("do_predict")
        if evaluates and predicts and validation is not None and test is not None:
            raise UsageError(
                "--do_eval --validation_file and --do_predict --test_file: bertbench predicts one file per command; "
                "predict the test file with a second command on the same --output_dir (it uses the trained run)"
            )
        for action, file, other in (("do_eval", validation, "validation_file"), ("do_predict", test, "test_file")):
            if fields.get(action) and file is None:
                raise UsageError(f"--{action} with HF's files needs --{other}")
        predicted = validation if evaluates else test if predicts else None
        return super().from_flags(
            {**fields, "predict_file": predicted, "do_predict": predicted is not None, "do_eval": bool(evaluates)}
        )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.do_train or self.do_predict):
            raise UsageError("at least one of --do_train or --do_predict must be true")
        if self.do_eval and not self.do_predict:
            raise UsageError("--do_eval scores the predictions: it needs --do_predict")
        for action, name in (("do_train", "train_file"), ("do_predict", "predict_file")):
            if getattr(self, action) and not getattr(self, name):
                raise UsageError(f"--{action} needs --{name}")
        if self.max_seq_length <= self.max_query_length + 3:
            raise UsageError(
                f"--max_seq_length {self.max_seq_length} must exceed --max_query_length "
                f"{self.max_query_length} + 3 ([CLS], [SEP], [SEP]) to leave room for the context"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SquadData(FineTuningData):
    examples: list[SquadExample] | None  # the predict file's, with its windows and its questions as scored
    features: SquadFeatures | None
    questions: list[ScoredQuestion] | None
    file_is_version_2: bool = False
    answer_text: GoogleAnswerText | None = None  # None: the context's exact characters


def make_features(
    path: str,
    examples: list[SquadExample],
    tokenizer: BertTokenizer,
    settings: SquadSettings,
    training: bool,
    log: Callable[[str], None],
) -> SquadFeatures:
    started = time.perf_counter()
    try:
        features = convert_examples(
            examples,
            tokenizer,
            settings.max_seq_length,
            settings.doc_stride,
            settings.max_query_length,
            training,
            settings.train_answer_span,
        )
    except SquadDataError as error:
        raise SquadDataError(f"{path}: {error}") from None
    seconds = time.perf_counter() - started
    log(
        f"{path}: {len(examples)} questions -> {len(features)} windows of {settings.max_seq_length} tokens in "
        f"{seconds:.2f} s ({len(features) / max(seconds, 1e-9):,.0f} windows/s)"
    )
    return features


def read(settings: SquadSettings, tokenizer: BertTokenizer, log: Callable[[str], None]) -> SquadData:
    """Both files, read and made into windows: a bad predict file must not surface after hours of training."""
    train, description = None, ""
    if settings.do_train:
        examples = read_examples(
            settings.train_file,
            training=True,
            version_2=settings.version_2_with_negative,
            keep_unaligned_answers=settings.keep_unaligned_answers,
            warn=log,
        )[: settings.max_train_samples]
        features = make_features(settings.train_file, examples, tokenizer, settings, True, log)
        train = features.inputs
        description = (
            f"SQuAD {'v2.0' if settings.version_2_with_negative else 'v1.1'}: {len(examples)} questions "
            f"in {len(features)} windows"
        )
    examples = features = questions = None
    file_is_version_2 = False
    if settings.do_predict:
        limit = settings.max_eval_samples if settings.do_eval else settings.max_predict_samples
        examples = read_examples(settings.predict_file, training=False, version_2=settings.version_2_with_negative)
        examples = examples[:limit]
        features = make_features(settings.predict_file, examples, tokenizer, settings, False, log)
        questions, file_is_version_2 = read_questions(settings.predict_file)
        kept = {example.question_id for example in examples}
        questions = [question for question in questions if question.question_id in kept]
        if settings.do_eval and not any(question.has_answer for question in questions):
            raise SquadDataError(
                f"{settings.predict_file}: no answers to score (--do_eval); predict it without "
                "--do_eval, or give a dev file"
            )
    return SquadData(
        train=train,
        num_train_sequences=len(train["input_ids"]) if train else 0,
        description=description,
        examples=examples,
        features=features,
        questions=questions,
        file_is_version_2=file_is_version_2,
        answer_text=GoogleAnswerText(tokenizer) if settings.answer_text == "google" else None,
    )


def worker_score(settings: SquadSettings, data: SquadData) -> WorkerScore:
    """F1 on the predict file, for choosing among independent workers: it must be a dev file, with answers."""
    if not any(question.has_answer for question in data.questions):
        raise UsageError(
            f"{settings.predict_file}: no answers to score, so --no_sync_gradients cannot "
            "choose a worker; predict a dev file"
        )

    def f1(estimator: Estimator) -> float:
        predictions = answer(settings, data, estimator)
        return official_scores(settings, data.questions, data.file_is_version_2, predictions, log=lambda line: None)[
            "f1"
        ]

    return WorkerScore("f1", f1)


def answer(
    settings: SquadSettings, data: SquadData, estimator: Estimator, log: Callable[[str], None] = lambda line: None
) -> SquadPredictions:
    """The model's answer (and n-best list, and v2.0 null odds) to every question of the predict file."""
    examples, features = data.examples, data.features
    started = time.perf_counter()
    logits = estimator.predict(features.inputs, settings.predict_batch_size, outputs=("start_logits", "end_logits"))
    predicted = time.perf_counter()
    predictions = postprocess(
        examples,
        features,
        logits["start_logits"].numpy(),
        logits["end_logits"].numpy(),
        settings.n_best_size,
        settings.max_answer_length,
        settings.version_2_with_negative,
        settings.null_score_diff_threshold,
        data.answer_text,
    )
    log(
        f"predicted {len(examples)} questions ({len(features)} windows) in {predicted - started:.2f} s "
        f"({len(features) / max(predicted - started, 1e-9):,.1f} windows/s), answers chosen in "
        f"{time.perf_counter() - predicted:.2f} s"
    )
    return predictions


def official_scores(
    settings: SquadSettings,
    questions: list[ScoredQuestion],
    file_is_version_2: bool,
    predictions: SquadPredictions,
    log: Callable[[str], None],
) -> dict[str, float]:
    return evaluate(
        questions,
        predictions.answers,
        file_is_version_2,
        predictions.null_odds,
        settings.null_score_diff_threshold,
        warn=log,
    )


def predict(
    settings: SquadSettings, estimator: Estimator, data: SquadData, is_main: bool, log: Callable[[str], None]
) -> dict[str, float]:
    """Write predictions.json, nbest_predictions.json and (v2.0) null_odds.json; score them when the predict file
    has answers. Returns what NVIDIA's run_squad logs of them: the prediction's time and windows/s, and the
    official exact match and F1 when scored."""
    if not settings.do_predict:
        return {}
    output_dir = estimator.run_config.model_dir
    started = time.perf_counter()
    predictions = answer(settings, data, estimator, log)
    seconds = time.perf_counter() - started
    figures = {"e2e_inference_time": seconds, "inference_sequences_per_second": len(data.features) / max(seconds, 1e-9)}
    outputs = {SQUAD_PREDICTIONS: predictions.answers, SQUAD_NBEST: predictions.nbest}
    if predictions.null_odds is not None:
        outputs[SQUAD_NULL_ODDS] = predictions.null_odds
    if is_main:
        os.makedirs(output_dir, exist_ok=True)
        for name, content in outputs.items():
            write_json(os.path.join(output_dir, name), content)
        log(f"{', '.join(outputs)} written to {output_dir}")

    if not any(question.has_answer for question in data.questions):
        return figures
    scores = official_scores(settings, data.questions, data.file_is_version_2, predictions, log)
    results = {
        **scores,
        "global_step": estimator.global_step,
        "questions": len(data.examples),
        "windows": len(data.features),
        **{f"eval_{key}": value for key, value in scores.items()},  # HF run_qa's names
        "eval_samples": len(data.features),
    }
    report_eval(
        estimator.run_config,
        f"{os.path.basename(settings.predict_file)}, step {estimator.global_step}",
        results,
        {"predict_file": settings.predict_file},
        is_main,
        log,
    )
    return {**figures, "exact_match": scores.get("exact_match", scores.get("exact")), "F1": scores["f1"]}


SPEC = FineTuningRunner(
    name=PROGRAM,
    description=__doc__.splitlines()[0],
    settings=SquadSettings,
    defaults={"max_seq_length": 384},
    input_errors=(SquadDataError,),
    model_task="question_answering",
    scored_by="do_predict",
    read_files=read,
    dev_score=worker_score,
    evaluate=predict,
)


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    return SPEC.main(argv, prog)


if __name__ == "__main__":
    sys.exit(main())
