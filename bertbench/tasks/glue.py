"""GLUE: the task files of the GLUE v1 release, model inputs, the GLUE metrics and leaderboard submission files.

`data_dir` is a task's directory of the standard download (`glue_data/MNLI`, as Google's `--data_dir`); the GLUE
root (`glue_data`) works too. Columns and label lists are those of Google's run_classifier.py (and of HF's
processors for the tasks Google left out). Files are read as raw TSV, `csv.QUOTE_NONE`: MNLI and QQP rows hold
unbalanced quote characters, which a quoting reader would run on across lines.

Lines end at "\n" and every carriage return is dropped, as TensorFlow's line reader under Google's run_classifier
does: a CRLF file reads as LF, and a lone CR inside a field joins its two sides ("first\rhalf" reads "firsthalf").
A row with too few fields is an error naming the file and line, except in QQP, whose real files hold such rows: they
are skipped, as HF's processor skips them, and a warning names the file and the lines.

Train and dev examples get guids `train-0`, `dev_matched-3`, ...; test examples keep the file's `index` (QQP: `id`)
column, which the leaderboard expects in the submission file.

HF's run_glue.py reads its own data too, csv or JSON-lines files (`FileTask`, `read_file_task`), with its rules: the
`label` column; `sentence1` and `sentence2` when both are there (with a GLUE task name, that task's columns of HF's
GLUE datasets), else the first two other columns, else the first; the training file's labels, sorted, are the
classes, and float labels make a regression; a test file's labels, if any, are not read. Its predictions are HF's
`predict_results_<task>.txt`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertbench.common.durable import write_atomically
from bertbench.tasks.tokenization import BertTokenizer


def print_warning(message: str) -> None:
    print(message, file=sys.stderr)


class GlueDataError(ValueError):
    """A GLUE file is missing or unreadable; the message names the file and, where there is one, the 1-based line."""


@dataclass(frozen=True)
class InputExample:
    """One example. text_b is None for single-sentence tasks; a text_b that tokenizes to nothing (empty, spaces) also
    makes no second segment, as in Google's code. label is a label string, a float (STS-B) or None (test)."""

    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None


@dataclass(frozen=True)
class Columns:
    """Where a file keeps its fields (0-based). label -1 is the last field (MNLI's gold_label follows a varying
    number of annotator labels); label None is an unlabelled file; guid None numbers the examples instead."""

    text_a: int
    text_b: int | None
    label: int | None
    header: bool = True
    guid: int | None = None

    @property
    def min_fields(self) -> int:
        used = [index for index in (self.text_a, self.text_b, self.label, self.guid) if index is not None]
        return max(used) + 1 + (self.label == -1)


@dataclass(frozen=True)
class Split:
    file_name: str
    columns: Columns
    submission_name: str | None = None  # test splits: the file name the GLUE leaderboard expects


@dataclass(frozen=True, eq=False)
class Task:
    """A sentence (pair) classification or regression task: its name, labels and metric."""

    name: str  # GLUE's spelling, which is also the task's directory name in the download
    labels: tuple[str, ...]  # empty for a regression (STS-B)
    metric: str  # "mcc", "acc_and_f1", "pearson_and_spearman", "acc" or (HF's for regression files) "mse"

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.labels)

    @property
    def main_metric(self) -> str:
        """The key of compute_metrics' result that ranks models on this task, as the GLUE leaderboard does."""
        return "corr" if self.metric == "pearson_and_spearman" else self.metric

    @property
    def hf_name(self) -> str:
        """HF's run_glue name of the task: mrpc, sst2, stsb, ... (what its predict_results_<task>.txt is named by)."""
        return self.name.lower().replace("-", "")


@dataclass(frozen=True, eq=False)
class GlueProcessor(Task):
    """One GLUE task: its files, labels and metric."""

    train: Split | None
    dev: Mapping[str, Split]
    test: Mapping[str, Split]
    directories: tuple[str, ...]  # names the task directory may have under the GLUE root
    skip_short_rows: bool = False  # QQP: rows with missing fields are skipped with a warning, not an error

    def train_examples(
        self, data_dir: str | os.PathLike, warn: Callable[[str], None] = print_warning
    ) -> list[InputExample]:
        """The training set; `warn` receives the warning about skipped rows (QQP)."""
        if self.train is None:
            raise GlueDataError(
                f"GLUE task {self.name} has no training set: it is predicted by a model trained on MNLI"
            )
        return self._read(data_dir, "train", self.train, warn)

    def dev_sets(
        self, data_dir: str | os.PathLike, warn: Callable[[str], None] = print_warning
    ) -> dict[str, list[InputExample]]:
        """Every labelled evaluation set by name: {"dev": ...}; MNLI {"dev_matched": ..., "dev_mismatched": ...}."""
        return {name: self._read(data_dir, name, split, warn) for name, split in self.dev.items()}

    def test_sets(
        self, data_dir: str | os.PathLike, warn: Callable[[str], None] = print_warning
    ) -> dict[str, list[InputExample]]:
        """Every unlabelled test set by name (label None, guid the file's index): {"test": ...}; MNLI
        {"test_matched": ..., "test_mismatched": ...}."""
        return {name: self._read(data_dir, name, split, warn) for name, split in self.test.items()}

    def _locate(self, data_dir: str | os.PathLike, file_name: str) -> str:
        data_dir = os.fspath(data_dir)
        candidates = [os.path.join(data_dir, file_name)]
        candidates += [os.path.join(data_dir, directory, file_name) for directory in self.directories]
        for candidate in candidates:
            if os.path.isfile(candidate):
                return candidate
        raise GlueDataError(
            f"{candidates[0]}: no such file for GLUE task {self.name} (data_dir should be the task's "
            f"directory of the GLUE download, e.g. glue_data/{self.directories[0]})"
        )

    def _read(
        self, data_dir: str | os.PathLike, split_name: str, split: Split, warn: Callable[[str], None]
    ) -> list[InputExample]:
        path = self._locate(data_dir, split.file_name)
        text = _read_text(path)
        columns = split.columns
        # Dropping every CR leaves the line numbers as they are: lines end at "\n" only.
        reader = csv.reader(io.StringIO(text.replace("\r", ""), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
        examples = []
        short_rows = []
        for row in reader:
            line = reader.line_num  # one row per line: QUOTE_NONE never continues a field onto the next line
            if columns.header and line == 1:
                # An example there means the header is missing: it would be skipped, silently, as the header.
                if (
                    columns.label is not None
                    and len(row) >= columns.min_fields
                    and self._label_value(row[columns.label]) is not None
                ):
                    raise GlueDataError(
                        f"{path}:1: an example ({self.name} label {row[columns.label]!r}) where the "
                        f"header line belongs: {self.name} {split_name} files start with a header"
                    )
                continue
            if not row:
                continue
            if len(row) < columns.min_fields:
                if self.skip_short_rows:
                    short_rows.append(line)
                    continue
                raise GlueDataError(
                    f"{path}:{line}: {len(row)} tab-separated field{'s' if len(row) != 1 else ''}, "
                    f"{self.name} {split_name} rows need at least {columns.min_fields}"
                )
            label = None if columns.label is None else self._parse_label(path, line, row[columns.label])
            guid = f"{split_name}-{len(examples)}" if columns.guid is None else row[columns.guid]
            text_b = None if columns.text_b is None else row[columns.text_b]
            examples.append(InputExample(guid, row[columns.text_a], text_b, label))
        if short_rows:
            shown = ", ".join(map(str, short_rows[:10])) + (", ..." if len(short_rows) > 10 else "")
            warn(
                f"warning: {path}: skipped {len(short_rows)} row{'s' if len(short_rows) != 1 else ''} with fewer "
                f"than {columns.min_fields} tab-separated fields (line{'s' if len(short_rows) != 1 else ''} {shown}), "
                f"as HF's {self.name} processor skips them"
            )
        if not examples:
            raise GlueDataError(f"{path}: no examples")
        return examples

    def _label_value(self, raw: str) -> str | float | None:
        """The label `raw` spells (a label string, or a finite score for regression), None when it is none."""
        if not self.is_regression:
            return raw if raw in self.labels else None
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if math.isfinite(value) else None

    def _parse_label(self, path: str, line: int, raw: str) -> str | float:
        value = self._label_value(raw)
        if value is not None:
            return value
        if not self.is_regression:
            raise GlueDataError(
                f"{path}:{line}: unknown label {raw!r} for {self.name}, expected one of {', '.join(self.labels)}"
            )
        raise GlueDataError(f"{path}:{line}: label {raw!r} is not a number ({self.name} scores are floats)")


def _read_text(path: str) -> str:
    """A data file's text, UTF-8 without its byte-order mark; a byte that does not decode is an error naming its
    line."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise GlueDataError(f"{path}: no such file") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise GlueDataError(f"{path}:{line}: not valid UTF-8") from None


def _standard_task(
    name: str, labels: tuple[str, ...], metric: str, labelled: Columns, test: Columns, skip_short_rows: bool = False
) -> GlueProcessor:
    """A task with train.tsv and dev.tsv laid out alike, and test.tsv."""
    return GlueProcessor(
        name=name,
        labels=labels,
        metric=metric,
        train=Split("train.tsv", labelled),
        dev={"dev": Split("dev.tsv", labelled)},
        test={"test": Split("test.tsv", test, f"{name}.tsv")},
        directories=(name,),
        skip_short_rows=skip_short_rows,
    )


BINARY = ("0", "1")
MNLI_LABELS = ("contradiction", "entailment", "neutral")
ENTAILMENT_LABELS = ("entailment", "not_entailment")
# index, sentence1 (QNLI: question), sentence2 (QNLI: sentence), label: QNLI, RTE and WNLI.
INDEX_PAIR = Columns(text_a=1, text_b=2, label=3)
INDEX_PAIR_TEST = Columns(text_a=1, text_b=2, label=None, guid=0)
# index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse sentence2_parse
# sentence1 sentence2 [label1 ... label5] gold_label
MNLI_COLUMNS = Columns(text_a=8, text_b=9, label=-1)
MNLI_TEST = Columns(text_a=8, text_b=9, label=None, guid=0)

_TASKS = (
    # CoLA train/dev: source, label, original annotation, sentence, with no header; test: index, sentence.
    _standard_task(
        "CoLA",
        BINARY,
        "mcc",
        Columns(text_a=3, text_b=None, label=1, header=False),
        Columns(text_a=1, text_b=None, label=None, guid=0),
    ),
    # sentence, label; test: index, sentence.
    _standard_task(
        "SST-2",
        BINARY,
        "acc",
        Columns(text_a=0, text_b=None, label=1),
        Columns(text_a=1, text_b=None, label=None, guid=0),
    ),
    # Quality, #1 ID, #2 ID, #1 String, #2 String; test: index, #1 ID, #2 ID, #1 String, #2 String.
    _standard_task(
        "MRPC",
        BINARY,
        "acc_and_f1",
        Columns(text_a=3, text_b=4, label=0),
        Columns(text_a=3, text_b=4, label=None, guid=0),
    ),
    # index genre filename year old_index source1 source2 sentence1 sentence2 score; test without score.
    _standard_task(
        "STS-B",
        (),
        "pearson_and_spearman",
        Columns(text_a=7, text_b=8, label=9),
        Columns(text_a=7, text_b=8, label=None, guid=0),
    ),
    # id qid1 qid2 question1 question2 is_duplicate; test: id question1 question2.
    # Real QQP files hold rows with missing fields (questions cut by a newline): skipped, as HF's processor does.
    _standard_task(
        "QQP",
        BINARY,
        "acc_and_f1",
        Columns(text_a=3, text_b=4, label=5),
        Columns(text_a=1, text_b=2, label=None, guid=0),
        skip_short_rows=True,
    ),
    GlueProcessor(
        name="MNLI",
        labels=MNLI_LABELS,
        metric="acc",
        train=Split("train.tsv", MNLI_COLUMNS),
        dev={
            "dev_matched": Split("dev_matched.tsv", MNLI_COLUMNS),
            "dev_mismatched": Split("dev_mismatched.tsv", MNLI_COLUMNS),
        },
        test={
            "test_matched": Split("test_matched.tsv", MNLI_TEST, "MNLI-m.tsv"),
            "test_mismatched": Split("test_mismatched.tsv", MNLI_TEST, "MNLI-mm.tsv"),
        },
        directories=("MNLI",),
    ),
    _standard_task("QNLI", ENTAILMENT_LABELS, "acc", INDEX_PAIR, INDEX_PAIR_TEST),
    _standard_task("RTE", ENTAILMENT_LABELS, "acc", INDEX_PAIR, INDEX_PAIR_TEST),
    _standard_task("WNLI", BINARY, "acc", INDEX_PAIR, INDEX_PAIR_TEST),
    # The diagnostic (index, sentence1, sentence2), unlabelled: an MNLI model's predictions, scored by GLUE with MCC.
    GlueProcessor(
        name="AX",
        labels=MNLI_LABELS,
        metric="mcc",
        train=None,
        dev={},
        test={"test": Split("diagnostic.tsv", INDEX_PAIR_TEST, "AX.tsv")},
        directories=("AX", "diagnostic"),
    ),
)

PROCESSORS: dict[str, GlueProcessor] = {processor.name.lower(): processor for processor in _TASKS}
# mnli-mm is HF's name for the mismatched evaluation; MNLI evaluates both dev sets anyway.
PROCESSORS.update(
    {
        "sst2": PROCESSORS["sst-2"],
        "stsb": PROCESSORS["sts-b"],
        "mnli-mm": PROCESSORS["mnli"],
        "diagnostic": PROCESSORS["ax"],
    }
)


# HF's GLUE datasets' text columns of each task (run_glue.py's task_to_keys): a csv/json file with a task name uses
# them when it has them.
HF_TASK_COLUMNS = {
    "cola": ("sentence", None),
    "mnli": ("premise", "hypothesis"),
    "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "qqp": ("question1", "question2"),
    "rte": ("sentence1", "sentence2"),
    "sst2": ("sentence", None),
    "stsb": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}


@dataclass(frozen=True, eq=False)
class FileTask(Task):
    """HF run_glue's own data: csv or JSON-lines files, read with its rules (see the module's doc), whose examples
    are read when the task is made (read_file_task). `glue_name` is the GLUE task whose metric scores them, if any."""

    glue_name: str | None
    text_columns: tuple[str, str | None]
    splits: Mapping[str, list[InputExample]]  # "train", and "dev" / "test" when their files are given

    @property
    def hf_name(self) -> str:
        """HF's name for the task in its file names: the GLUE task's, or None (its predict_results_None.txt)."""
        return "None" if self.glue_name is None else get_processor(self.glue_name).hf_name

    def train_examples(self, data_dir: None = None, warn: Callable[[str], None] = print_warning) -> list[InputExample]:
        return self.splits["train"]

    def dev_sets(self, data_dir: None = None, warn: Callable[[str], None] = print_warning) -> dict[str, list]:
        return {"dev": self.splits["dev"]} if "dev" in self.splits else {}

    def test_sets(self, data_dir: None = None, warn: Callable[[str], None] = print_warning) -> dict[str, list]:
        return {"test": self.splits["test"]} if "test" in self.splits else {}


def read_file_task(
    train_file: str,
    validation_file: str | None = None,
    test_file: str | None = None,
    task_name: str | None = None,
) -> FileTask:
    """HF run_glue's csv or JSON-lines files read as it reads them (see the module's doc): the training file says the
    text columns and the labels; the validation file is scored (split "dev"), the test file predicted (its guids
    0, 1, ..., HF's index). With `task_name`, that GLUE task's metric, and its columns where the files have them;
    without, accuracy, or HF's MSE for a regression. Every fault is a GlueDataError naming the file and line."""
    glue = get_processor(task_name) if task_name is not None else None
    columns, rows = _read_table(train_file)
    if "label" not in columns:
        raise GlueDataError(f"{train_file}: no 'label' column (its columns: {', '.join(columns)})")
    others = [column for column in columns if column != "label"]
    if not others:
        raise GlueDataError(f"{train_file}: no text column besides 'label'")
    known = HF_TASK_COLUMNS.get(glue.hf_name) if glue is not None else None
    if known is not None and all(column in columns for column in known if column is not None):
        text_columns = known
    elif "sentence1" in others and "sentence2" in others:
        text_columns = ("sentence1", "sentence2")
    else:
        text_columns = (others[0], others[1] if len(others) > 1 else None)
    values = [(line, _label_value(train_file, line, row.get("label"))) for line, row in rows]
    regression = _is_regression(train_file, values)
    if glue is not None and glue.is_regression != regression:
        raise GlueDataError(
            f"{train_file}: {'number' if regression else 'class'} labels, but {glue.name} is a "
            f"{'regression' if glue.is_regression else 'classification'} task"
        )
    labels: tuple[str, ...] = ()
    if not regression:
        first = type(values[0][1])
        line, value = next(((line, value) for line, value in values if type(value) is not first), (None, None))
        if line is not None:
            raise GlueDataError(
                f"{train_file}:{line}: label {value!r}, where line {values[0][0]}'s is {values[0][1]!r}: the labels "
                "mix text and numbers"
            )
        labels = tuple(str(value) for value in sorted({value for _, value in values}))  # HF sorts them
        if len(labels) < 2:
            raise GlueDataError(f"{train_file}: every label is {labels[0]!r}: a classifier needs two classes or more")
    task = FileTask(
        name=glue.name if glue is not None else os.path.basename(train_file),
        labels=labels,
        metric=glue.metric if glue is not None else "mse" if regression else "acc",
        glue_name=None if glue is None else glue.name,
        text_columns=text_columns,
        splits={},
    )
    splits = {"train": _file_examples(task, train_file, "train", (columns, rows))}
    if validation_file is not None:
        splits["dev"] = _file_examples(task, validation_file, "dev", _read_table(validation_file))
    if test_file is not None:
        splits["test"] = _file_examples(task, test_file, "test", _read_table(test_file))
    return dataclasses.replace(task, splits=splits)


def _read_table(path: str) -> tuple[list[str], list[tuple[int, dict]]]:
    """A csv file's header and rows, or a JSON-lines file's keys (of its first record) and records, each row with
    its 1-based line; a file holding one JSON array of records reads as JSON lines (record k at line k)."""
    text = _read_text(path)
    if path.endswith(".csv"):
        rows = _csv_rows(path, text)
    elif path.endswith((".json", ".jsonl")):
        rows = _json_rows(path, text)
    else:
        raise GlueDataError(f"{path}: HF's run_glue reads .csv or .json (JSON lines) files")
    if not rows:
        raise GlueDataError(f"{path}: no examples")
    return list(rows[0][1]), rows


def _csv_rows(path: str, text: str) -> list[tuple[int, dict]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header, rows, line = None, [], 1
    for row in reader:
        start, line = line, reader.line_num + 1  # a quoted field may run over several lines
        if not row:
            continue
        if header is None:
            header = row
            continue
        if len(row) != len(header):
            raise GlueDataError(f"{path}:{start}: {len(row)} comma-separated fields, the header has {len(header)}")
        rows.append((start, dict(zip(header, row))))
    return rows


def _json_rows(path: str, text: str) -> list[tuple[int, dict]]:
    if text.lstrip().startswith("["):
        try:
            records = list(enumerate(json.loads(text), 1))
        except json.JSONDecodeError as error:
            raise GlueDataError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    else:
        records = []
        for line, content in enumerate(text.split("\n"), 1):
            if content.strip():
                try:
                    records.append((line, json.loads(content)))
                except json.JSONDecodeError as error:
                    raise GlueDataError(f"{path}:{line}: not valid JSON ({error.msg})") from None
    for line, record in records:
        if not isinstance(record, dict):
            raise GlueDataError(f"{path}:{line}: {type(record).__name__}, expected a JSON object (one example)")
    return records


def _label_value(path: str, line: int, raw) -> int | float | str:
    """A file's label as its loader types it: a csv cell that reads as an integer or a number is one, as pandas reads
    it; a JSON value as it is (a boolean as text)."""
    if isinstance(raw, str):
        text = raw.strip()
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        if text:
            return raw
    elif isinstance(raw, bool):
        return str(raw)
    elif isinstance(raw, (int, float)):
        return raw
    if raw is None or raw == "":
        raise GlueDataError(f"{path}:{line}: no label")
    raise GlueDataError(f"{path}:{line}: label {raw!r} is neither text nor a number")


def _is_regression(path: str, values: list[tuple[int, int | float | str]]) -> bool:
    """HF's rule: a label column of floats is a regression; its values must then be finite."""
    if not any(isinstance(value, float) for _, value in values):
        return False
    for line, value in values:
        if isinstance(value, str) or not math.isfinite(value):
            raise GlueDataError(f"{path}:{line}: label {value!r} is not a finite number, as the file's others are")
    return True


def _file_examples(task: FileTask, path: str, split: str, table: tuple[list[str], list[tuple[int, dict]]]) -> list:
    """The examples of one of a FileTask's files: its text columns, and its labels but in a test file."""
    columns, rows = table
    wanted = [column for column in (*task.text_columns, "label" if split != "test" else None) if column is not None]
    missing = [column for column in wanted if column not in columns]
    if missing:
        raise GlueDataError(
            f"{path}: no {', '.join(repr(column) for column in missing)} column, which the training file has"
        )
    examples = []
    for line, row in rows:
        texts = []
        for column in task.text_columns:
            value = None if column is None else row.get(column)
            if column is not None and not isinstance(value, str):
                raise GlueDataError(f"{path}:{line}: column {column!r} holds {value!r}, not text")
            texts.append(value)
        label = None
        if split != "test":
            value = _label_value(path, line, row["label"])
            if task.is_regression:
                if isinstance(value, str) or not math.isfinite(value):
                    raise GlueDataError(
                        f"{path}:{line}: label {value!r} is not a finite number ({task.name} is a regression)"
                    )
                label = float(value)
            elif isinstance(value, float) or str(value) not in task.labels:
                raise GlueDataError(
                    f"{path}:{line}: label {row['label']!r} is not one of the training file's labels "
                    f"({', '.join(task.labels)})"
                )
            else:
                label = str(value)
        guid = str(len(examples)) if split == "test" else f"{split}-{len(examples)}"
        examples.append(InputExample(guid, texts[0], texts[1], label))
    return examples


def glue_task(
    task_name: str | None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
) -> Task:
    """The task a classifier command names: HF's csv/json files when it gives a train_file (read now, the others'
    files when given), else the GLUE task `task_name` (its files are read later, from its data_dir)."""
    if train_file is not None:
        return read_file_task(train_file, validation_file, test_file, task_name)
    return get_processor(task_name)


def get_processor(task: str | Task) -> Task:
    """The processor of a task name in any case ("MNLI", "sst-2", "stsb"); a task is returned as it is."""
    if isinstance(task, Task):
        return task
    try:
        return PROCESSORS[task.lower()]
    except KeyError:
        raise ValueError(f"unknown GLUE task {task!r}, choose from {', '.join(PROCESSORS)}") from None


def encode_examples(
    examples: Sequence[InputExample], tokenizer: BertTokenizer, task: str | Task, max_seq_length: int
) -> dict[str, torch.Tensor]:
    """input_ids, token_type_ids, attention_mask (int64, (n, max_seq_length)) and labels: int64 indices into the
    task's labels, or float32 scores for regression; an unlabelled example gives -1, or nan for regression."""
    processor = get_processor(task)
    inputs = tokenizer.encode_batch([(example.text_a, example.text_b) for example in examples], max_seq_length)
    if processor.is_regression:
        targets = torch.tensor(
            [math.nan if example.label is None else float(example.label) for example in examples], dtype=torch.float32
        )
    else:
        index = {label: position for position, label in enumerate(processor.labels)}
        targets = torch.tensor(
            [-1 if example.label is None else index[example.label] for example in examples], dtype=torch.long
        )
    return {
        "input_ids": torch.from_numpy(inputs.input_ids),
        "token_type_ids": torch.from_numpy(inputs.token_type_ids),
        "attention_mask": torch.from_numpy(inputs.attention_mask),
        "labels": targets,
    }


def _as_numpy(values) -> np.ndarray:
    return torch.as_tensor(values).detach().cpu().numpy()


def _predicted(processor: Task, predictions) -> np.ndarray:
    """Label indices (classification) or scores (regression) from predictions or from logits of shape (n, labels)."""
    predictions = _as_numpy(predictions)
    if processor.is_regression:
        return predictions.astype(np.float64).reshape(len(predictions))
    if predictions.ndim == 2:
        return predictions.argmax(axis=1)
    return predictions.astype(np.int64)


def compute_metrics(task: str | Task, predictions, labels) -> dict[str, float]:
    """GLUE's metric of the task. predictions: label indices or logits (n, num_labels); STS-B scores, (n,) or (n, 1).
    CoLA (and AX) {"mcc"}; MRPC and QQP {"acc", "f1", "acc_and_f1"}; STS-B {"pearson", "spearmanr", "corr"}
    (corr is their mean); the others {"acc"}; HF's regression files without a GLUE task {"mse"}."""
    processor = get_processor(task)
    predicted = _predicted(processor, predictions)
    truth = _as_numpy(labels).reshape(-1)
    if predicted.shape != truth.shape or not len(truth):
        raise ValueError(f"{len(predicted)} predictions for {len(truth)} labels; expected as many, at least one")
    if processor.is_regression:
        truth = truth.astype(np.float64)
        if np.isnan(truth).any():
            raise ValueError(f"{processor.name} labels include nan: unlabelled examples cannot be scored")
        if processor.metric == "mse":
            return {"mse": float(((predicted - truth) ** 2).mean())}
        from scipy import stats  # here, not at import: ~0.5 s that a process which never scores STS-B skips

        pearson = float(stats.pearsonr(predicted, truth).statistic)
        spearman = float(stats.spearmanr(predicted, truth).statistic)
        return {"pearson": pearson, "spearmanr": spearman, "corr": (pearson + spearman) / 2}
    truth = truth.astype(np.int64)
    if (truth < 0).any():
        raise ValueError(f"{processor.name} labels include -1: unlabelled examples cannot be scored")
    if processor.metric == "mcc":
        from sklearn import metrics  # here, not at import: ~0.5 s that a process which never scores CoLA skips

        return {"mcc": float(metrics.matthews_corrcoef(truth, predicted))}
    accuracy = float((predicted == truth).mean())
    if processor.metric == "acc_and_f1":
        # F1 of label 1, 0 when neither labels nor predictions have one: sklearn's f1_score(labels=[0, 1],
        # zero_division=0), value for value, without importing sklearn in every process that scores MRPC or QQP
        true_positives = int(((predicted == 1) & (truth == 1)).sum())
        positives = int((predicted == 1).sum() + (truth == 1).sum())
        f1 = 2 * true_positives / positives if positives else 0.0
        return {"acc": accuracy, "f1": f1, "acc_and_f1": (accuracy + f1) / 2}
    return {"acc": accuracy}


# HF's names (evaluate's "glue", "accuracy" and "mse" metrics) for compute_metrics' figures.
HF_METRIC_NAMES = {
    "acc": "accuracy",
    "f1": "f1",
    "mcc": "matthews_correlation",
    "pearson": "pearson",
    "spearmanr": "spearmanr",
    "mse": "mse",
}


def hf_metrics(scores: Mapping[str, float]) -> dict[str, float]:
    """compute_metrics' figures under HF run_glue's names, with its combined_score (their mean) when there are
    several: MRPC {"accuracy", "f1", "combined_score"}, CoLA {"matthews_correlation"}, ..."""
    named = {HF_METRIC_NAMES[key]: value for key, value in scores.items() if key in HF_METRIC_NAMES}
    if len(named) > 1:
        named["combined_score"] = float(np.mean(list(named.values())))
    return named


def submission_file_name(task: str | Task, split_name: str) -> str:
    """The leaderboard's name for a test split's predictions: CoLA.tsv, ..., MNLI-m.tsv, MNLI-mm.tsv, AX.tsv; HF's
    predict_results_<task>.txt for HF's own files (FileTask)."""
    processor = get_processor(task)
    if isinstance(processor, FileTask):
        return f"predict_results_{processor.hf_name}.txt"
    if split_name not in processor.test:
        raise ValueError(
            f"{processor.name} has no test split {split_name!r}, its test splits: {', '.join(processor.test)}"
        )
    return processor.test[split_name].submission_name


def write_submission(path: str | os.PathLike, processor: str | Task, guids: Sequence[str], predictions) -> None:
    """Write `index<TAB>prediction` lines as the GLUE leaderboard reads them: label strings, or STS-B scores clipped
    to [0, 5] (HF's files: not clipped, as HF's run_glue writes them). guids are the test examples' guids (the file's
    index column); predictions as `compute_metrics`. The file appears complete or not at all."""
    processor = get_processor(processor)
    predicted = _predicted(processor, predictions)
    if len(predicted) != len(guids):
        raise ValueError(f"{len(predicted)} predictions for {len(guids)} examples")
    if processor.is_regression:
        scores = predicted if isinstance(processor, FileTask) else np.clip(predicted, 0.0, 5.0)
        values = [f"{score:.3f}" for score in scores]
    else:
        values = [processor.labels[index] for index in predicted]
    lines = ["index\tprediction\n"] + [f"{guid}\t{value}\n" for guid, value in zip(guids, values)]
    write_atomically(path, "".join(lines))
