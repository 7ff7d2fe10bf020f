"""bertbench.tasks.glue on tiny files in the GLUE v1 release's layouts (headers copied from the release)."""

import math
import os

import numpy as np
import pytest
import torch

from bertbench.tasks.glue import (
    PROCESSORS,
    GlueDataError,
    InputExample,
    compute_metrics,
    encode_examples,
    get_processor,
    submission_file_name,
    write_submission,
)
from bertbench.tasks.tokenization import BertTokenizer

MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
    "sentence2_parse\tsentence1\tsentence2"
)
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
PARSES = "( ( a ) )\t( ( b ) )\t(ROOT (a))\t(ROOT (b))"
QUOTED = '"He said "no'  # unbalanced quotes: a quoting reader would swallow the following lines

FILES = {
    "CoLA/train.tsv": [
        "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.",
        "gj04\t0\t*\tOne more pseudo generalization and I'm giving up.",
    ],
    "CoLA/dev.tsv": ["gj04\t1\t\tThe sailors rode the breeze clear of the rocks."],
    "CoLA/test.tsv": ["index\tsentence", "0\tBill whistled past the house."],
    "SST-2/train.tsv": ["sentence\tlabel", "hide new secretions from the parental units \t0"],
    "SST-2/dev.tsv": ["sentence\tlabel", "it 's a charming and often affecting journey . \t1"],
    "SST-2/test.tsv": ["index\tsentence", "0\tuneasy mishmash of styles and genres ."],
    "MRPC/train.tsv": [
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        '1\t702876\t702977\tAmrozi accused his brother , whom he called " the witness " .\t'
        'Referring to him as only " the witness " , Amrozi accused his brother .',
    ],
    "MRPC/dev.tsv": ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "0\t1\t2\tHe left .\tShe stayed ."],
    "MRPC/test.tsv": [
        "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
        "0\t1089874\t1089925\tPCCW 's chief .\tCurrent chief .",
    ],
    "STS-B/train.tsv": [
        STSB_HEADER + "\tscore",
        "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\t"
        "An air plane is taking off.\t5.000",
    ],
    "STS-B/dev.tsv": [
        STSB_HEADER + "\tscore",
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing.\t"
        "A man wearing a hard hat is dancing.\t3.800",
    ],
    "STS-B/test.tsv": [
        STSB_HEADER,
        "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair."
        "\tA girl is brushing her hair.",
    ],
    "QQP/train.tsv": [
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
        "133273\t213221\t213222\tHow is the life of a math student?\tWhich level is enough for jlpt5?\t0",
    ],
    "QQP/dev.tsv": [
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
        "201359\t303345\t303346\tWhy are African-Americans so beautiful?\tWhy are hispanics so beautiful?\t1",
    ],
    "QQP/test.tsv": ["id\tquestion1\tquestion2", "0\tWhy am I mentally very lonely?\tHow can I get over it?"],
    "MNLI/train.tsv": [
        MNLI_HEADER + "\tlabel1\tgold_label",
        f"0\t31193\t31193n\tgovernment\t{PARSES}\t{QUOTED}\tProduct and geography are what "
        "make cream skimming work.\tneutral\tneutral",
        f"1\t101457\t101457e\ttelephone\t{PARSES}\tyou know\tYou lose the things.\tentailment\tentailment",
    ],
    "MNLI/dev_matched.tsv": [
        MNLI_HEADER + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
        f"0\t63735\t63735n\tslate\t{PARSES}\tThe new rights are nice.\tEveryone really likes "
        "them.\tneutral\tentailment\tneutral\tneutral\tneutral\tneutral",
    ],
    "MNLI/dev_mismatched.tsv": [
        MNLI_HEADER + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
        f"0\t75290\t75290c\tletters\t{PARSES}\tYour contribution helped.\tIt did not help."
        "\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction"
        "\tcontradiction",
    ],
    "MNLI/test_matched.tsv": [
        MNLI_HEADER,
        f"0\t31493\t31493\ttravel\t{PARSES}\tHierbas, ans seco.\tHierbas is a name.",
    ],
    "MNLI/test_mismatched.tsv": [MNLI_HEADER, f"0\t75\t75\tverbatim\t{PARSES}\tWhat have you decided?\tI decided."],
    "QNLI/train.tsv": [
        "index\tquestion\tsentence\tlabel",
        "0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it.\tnot_entailment",
    ],
    "QNLI/dev.tsv": ["index\tquestion\tsentence\tlabel", "0\tWhat came into force?\tThe treaty came.\tentailment"],
    "QNLI/test.tsv": ["index\tquestion\tsentence", "0\tWhat organization is devoted to Jihad?\tFor some decades."],
    "RTE/train.tsv": [
        "index\tsentence1\tsentence2\tlabel",
        "0\tNo Weapons of Mass Destruction Found.\tWeapons of Mass Destruction Found.\tnot_entailment",
    ],
    "RTE/dev.tsv": [
        "index\tsentence1\tsentence2\tlabel",
        "0\tDana Reeve died.\tChristopher Reeve had an accident.\tnot_entailment",
    ],
    "RTE/test.tsv": ["index\tsentence1\tsentence2", "0\tMangla was built.\tMangla is a dam."],
    "WNLI/train.tsv": [
        "index\tsentence1\tsentence2\tlabel",
        "0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1",
    ],
    "WNLI/dev.tsv": ["index\tsentence1\tsentence2\tlabel", "0\tThe drain is clogged.\tThe hair is clogged.\t0"],
    "WNLI/test.tsv": ["index\tsentence1\tsentence2", "0\tMaude and Dora had seen trains.\tHorses had seen trains."],
    "AX/diagnostic.tsv": ["index\tsentence1\tsentence2", "0\tThe cat sat on the mat.\tThe cat did not sit on the mat."],
}


def write_tsv(path, lines, ending="\n"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(ending.join(lines) + ending)


@pytest.fixture
def glue_dir(tmp_path):
    for name, lines in FILES.items():
        write_tsv(tmp_path / name, lines)
    return tmp_path


# task: (first train example, first dev example by dev set name, first test example by test set name)
EXPECTED = {
    "cola": (
        ("Our friends won't buy this analysis, let alone the next one we propose.", None, "1"),
        {"dev": ("The sailors rode the breeze clear of the rocks.", None, "1")},
        {"test": ("0", "Bill whistled past the house.", None)},
    ),
    "sst-2": (
        ("hide new secretions from the parental units ", None, "0"),
        {"dev": ("it 's a charming and often affecting journey . ", None, "1")},
        {"test": ("0", "uneasy mishmash of styles and genres .", None)},
    ),
    "mrpc": (
        (
            'Amrozi accused his brother , whom he called " the witness " .',
            'Referring to him as only " the witness " , Amrozi accused his brother .',
            "1",
        ),
        {"dev": ("He left .", "She stayed .", "0")},
        {"test": ("0", "PCCW 's chief .", "Current chief .")},
    ),
    "sts-b": (
        ("A plane is taking off.", "An air plane is taking off.", 5.0),
        {"dev": ("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 3.8)},
        {"test": ("0", "A girl is styling her hair.", "A girl is brushing her hair.")},
    ),
    "qqp": (
        ("How is the life of a math student?", "Which level is enough for jlpt5?", "0"),
        {"dev": ("Why are African-Americans so beautiful?", "Why are hispanics so beautiful?", "1")},
        {"test": ("0", "Why am I mentally very lonely?", "How can I get over it?")},
    ),
    "mnli": (
        (QUOTED, "Product and geography are what make cream skimming work.", "neutral"),
        {
            "dev_matched": ("The new rights are nice.", "Everyone really likes them.", "neutral"),
            "dev_mismatched": ("Your contribution helped.", "It did not help.", "contradiction"),
        },
        {
            "test_matched": ("0", "Hierbas, ans seco.", "Hierbas is a name."),
            "test_mismatched": ("0", "What have you decided?", "I decided."),
        },
    ),
    "qnli": (
        ("When did the third Digimon series begin?", "Unlike the two seasons before it.", "not_entailment"),
        {"dev": ("What came into force?", "The treaty came.", "entailment")},
        {"test": ("0", "What organization is devoted to Jihad?", "For some decades.")},
    ),
    "rte": (
        ("No Weapons of Mass Destruction Found.", "Weapons of Mass Destruction Found.", "not_entailment"),
        {"dev": ("Dana Reeve died.", "Christopher Reeve had an accident.", "not_entailment")},
        {"test": ("0", "Mangla was built.", "Mangla is a dam.")},
    ),
    "wnli": (
        ("I stuck a pin through a carrot.", "The carrot had a hole.", "1"),
        {"dev": ("The drain is clogged.", "The hair is clogged.", "0")},
        {"test": ("0", "Maude and Dora had seen trains.", "Horses had seen trains.")},
    ),
}


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_each_task_reads_its_columns(glue_dir, task):
    processor = PROCESSORS[task]
    train, dev, test = EXPECTED[task]
    data_dir = glue_dir / processor.name

    first = processor.train_examples(data_dir)[0]
    assert (first.text_a, first.text_b, first.label) == train
    assert first.guid == "train-0"

    dev_sets = processor.dev_sets(data_dir)
    assert list(dev_sets) == list(dev)
    for name, expected in dev.items():
        assert len(dev_sets[name]) == 1
        example = dev_sets[name][0]
        assert (example.text_a, example.text_b, example.label) == expected
        assert example.guid == f"{name}-0"

    test_sets = processor.test_sets(data_dir)
    assert list(test_sets) == list(test)
    for name, expected in test.items():
        example = test_sets[name][0]
        assert (example.guid, example.text_a, example.text_b, example.label) == (*expected, None)


def test_mnli_quote_characters_do_not_merge_lines(glue_dir):
    train = PROCESSORS["mnli"].train_examples(glue_dir / "MNLI")
    assert [example.text_a for example in train] == [QUOTED, "you know"]
    assert [example.label for example in train] == ["neutral", "entailment"]


def test_task_metadata():
    assert PROCESSORS["mnli"].labels == ("contradiction", "entailment", "neutral")
    assert PROCESSORS["qnli"].labels == PROCESSORS["rte"].labels == ("entailment", "not_entailment")
    assert PROCESSORS["cola"].labels == ("0", "1")
    assert PROCESSORS["sts-b"].is_regression and PROCESSORS["sts-b"].num_labels == 1
    assert not PROCESSORS["mrpc"].is_regression and PROCESSORS["mnli"].num_labels == 3


def test_aliases_and_case():
    assert get_processor("SST2") is get_processor("sst-2") is PROCESSORS["sst2"]
    assert get_processor("STSB") is PROCESSORS["sts-b"]
    assert get_processor("MNLI-MM") is get_processor("mnli")
    assert get_processor("CoLA").name == "CoLA"
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        get_processor("squad")


def test_single_sentence_tasks_have_no_second_text(glue_dir):
    for task in ("cola", "sst-2"):
        processor = PROCESSORS[task]
        examples = processor.train_examples(glue_dir / processor.name)
        examples += [example for split in processor.test_sets(glue_dir / processor.name).values() for example in split]
        assert examples and all(example.text_b is None for example in examples)


def test_cola_train_has_no_header(glue_dir):
    train = PROCESSORS["cola"].train_examples(glue_dir / "CoLA")
    assert [example.label for example in train] == ["1", "0"]
    assert train[1].text_a == "One more pseudo generalization and I'm giving up."


@pytest.mark.parametrize("layout", ["AX", "diagnostic"])
def test_ax_is_prediction_only(tmp_path, layout):
    write_tsv(tmp_path / layout / "diagnostic.tsv", FILES["AX/diagnostic.tsv"])
    processor = get_processor("ax")
    assert processor.labels == PROCESSORS["mnli"].labels
    for data_dir in (tmp_path / layout, tmp_path):  # the task directory, or the GLUE root
        (example,) = processor.test_sets(data_dir)["test"]
        assert example == InputExample("0", "The cat sat on the mat.", "The cat did not sit on the mat.", None)
        assert processor.dev_sets(data_dir) == {}
    with pytest.raises(GlueDataError, match="AX has no training set"):
        processor.train_examples(tmp_path)


def test_glue_root_as_data_dir(glue_dir):
    assert PROCESSORS["rte"].train_examples(glue_dir) == PROCESSORS["rte"].train_examples(glue_dir / "RTE")


def test_crlf_line_endings_and_blank_lines(tmp_path):
    write_tsv(tmp_path / "train.tsv", FILES["RTE/train.tsv"] + ["", "1\tA.\tB.\tentailment"], ending="\r\n")
    train = PROCESSORS["rte"].train_examples(tmp_path)
    assert [example.label for example in train] == ["not_entailment", "entailment"]


def test_lone_carriage_return_inside_a_field_is_dropped_as_in_googles_reader(tmp_path):
    # TensorFlow's line reader (tf.gfile under Google's _read_tsv) drops every CR and splits lines at LF only.
    write_tsv(
        tmp_path / "train.tsv",
        ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t1\t2\tfirst\rhalf\tsecond", "0\t3\t4\tplain\tpair"],
    )
    train = PROCESSORS["mrpc"].train_examples(tmp_path)
    assert [(example.text_a, example.text_b, example.label) for example in train] == [
        ("firsthalf", "second", "1"),
        ("plain", "pair", "0"),
    ]


def test_qqp_rows_with_missing_fields_are_skipped_with_a_warning_naming_file_and_lines(tmp_path):
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    write_tsv(
        tmp_path / "train.tsv",
        [
            header,
            "1\t1\t2\tWhy?\tHow?\t0",
            "2\t3\t4\tWhat is a",
            "question cut by a newline?\tWhere?\t1",
            "3\t5\t6\tWho?\tWhom?\t1",
        ],
    )
    warnings = []
    train = PROCESSORS["qqp"].train_examples(tmp_path, warnings.append)
    assert [example.text_a for example in train] == ["Why?", "Who?"]
    assert warnings == [
        f"warning: {tmp_path / 'train.tsv'}: skipped 2 rows with fewer than 6 tab-separated fields "
        "(lines 3, 4), as HF's QQP processor skips them"
    ]
    # Every other task still refuses such a row.
    write_tsv(tmp_path / "train.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t1\t2\ta"])
    with pytest.raises(GlueDataError, match=r"train\.tsv:2: 4 tab-separated fields"):
        PROCESSORS["mrpc"].train_examples(tmp_path)


def test_short_row_names_file_and_line(tmp_path):
    write_tsv(tmp_path / "train.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment", "1\ta b"])
    path = str(tmp_path / "train.tsv")
    with pytest.raises(GlueDataError) as info:
        PROCESSORS["rte"].train_examples(tmp_path)
    assert str(info.value) == f"{path}:3: 2 tab-separated fields, RTE train rows need at least 4"


def test_mnli_test_row_in_a_labelled_file_is_short(tmp_path):
    write_tsv(tmp_path / "dev_matched.tsv", FILES["MNLI/test_matched.tsv"])
    with pytest.raises(
        GlueDataError,
        match=r"dev_matched\.tsv:2: 10 tab-separated fields, MNLI dev_matched rows "
        r"need at least 11",
    ):
        PROCESSORS["mnli"].dev_sets(tmp_path)


def test_unknown_label_names_file_line_and_label(tmp_path):
    write_tsv(tmp_path / "dev.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t1\t2\ta\tb", "yes\t3\t4\tc\td"])
    with pytest.raises(GlueDataError) as info:
        PROCESSORS["mrpc"].dev_sets(tmp_path)
    assert str(info.value) == f"{tmp_path / 'dev.tsv'}:3: unknown label 'yes' for MRPC, expected one of 0, 1"


def test_stsb_score_must_be_a_number(tmp_path):
    row = "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\ta\tb\tfive"
    write_tsv(tmp_path / "train.tsv", [STSB_HEADER + "\tscore", row])
    with pytest.raises(GlueDataError, match=r"train\.tsv:2: label 'five' is not a number"):
        PROCESSORS["sts-b"].train_examples(tmp_path)


def test_invalid_utf8_names_the_line(tmp_path):
    (tmp_path / "train.tsv").write_bytes(b"sentence\tlabel\nfine\t0\nbad \xff byte\t1\n")
    with pytest.raises(GlueDataError, match=r"train\.tsv:3: not valid UTF-8"):
        PROCESSORS["sst-2"].train_examples(tmp_path)


def test_missing_file_names_path_and_task(tmp_path):
    with pytest.raises(GlueDataError) as info:
        PROCESSORS["mnli"].dev_sets(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'dev_matched.tsv'}: no such file for GLUE task MNLI")
    assert "\n" not in message


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "dog", "ran", "."]


@pytest.fixture
def tokenizer(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return BertTokenizer.from_vocab_file(tmp_path / "vocab.txt")


def ids(*tokens):
    return [VOCAB.index(token) for token in tokens]


def test_encode_pair_and_single_examples(tokenizer):
    examples = [
        InputExample("a", "The cat sat.", "the dog ran", "entailment"),
        InputExample("b", "the mat", None, "neutral"),
        InputExample("c", "cat", "dog", None),
    ]
    features = encode_examples(examples, tokenizer, "mnli", 12)
    assert set(features) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    for name in ("input_ids", "token_type_ids", "attention_mask"):
        assert features[name].shape == (3, 12) and features[name].dtype == torch.long
    pair = ids("[CLS]", "the", "cat", "sat", ".", "[SEP]", "the", "dog", "ran", "[SEP]")
    assert features["input_ids"][0].tolist() == pair + [0, 0]
    assert features["token_type_ids"][0].tolist() == [0] * 6 + [1] * 4 + [0, 0]
    assert features["attention_mask"][0].tolist() == [1] * 10 + [0, 0]
    assert features["input_ids"][1].tolist() == ids("[CLS]", "the", "mat", "[SEP]") + [0] * 8  # no second [SEP]
    assert features["token_type_ids"][1].sum() == 0
    assert features["labels"].dtype == torch.long
    assert features["labels"].tolist() == [1, 2, -1]


def test_encode_regression_labels(tokenizer):
    examples = [InputExample("0", "cat", "dog", 3.8), InputExample("1", "cat", "dog", None)]
    features = encode_examples(examples, tokenizer, "sts-b", 8)
    labels = features["labels"]
    assert labels.dtype == torch.float32 and labels.shape == (2,)
    assert labels[0].item() == pytest.approx(3.8) and math.isnan(labels[1].item())


def test_encode_read_files(glue_dir, tokenizer):
    processor = PROCESSORS["cola"]
    features = encode_examples(processor.train_examples(glue_dir / "CoLA"), tokenizer, processor, 16)
    assert features["input_ids"].shape == (2, 16)
    assert features["labels"].tolist() == [1, 0]


# Confusion with TP=3, TN=2, FP=1, FN=1 (positive = 1).
LABELS = [1, 1, 1, 1, 0, 0, 0]
PREDICTIONS = [1, 1, 1, 0, 1, 0, 0]


def test_classification_metrics_by_hand():
    mcc = (3 * 2 - 1 * 1) / math.sqrt((3 + 1) * (3 + 1) * (2 + 1) * (2 + 1))
    assert compute_metrics("cola", PREDICTIONS, LABELS) == {"mcc": pytest.approx(mcc)}
    f1 = 2 * 3 / (2 * 3 + 1 + 1)
    accuracy = 5 / 7
    for task in ("mrpc", "qqp"):
        assert compute_metrics(task, PREDICTIONS, LABELS) == pytest.approx(
            {"acc": accuracy, "f1": f1, "acc_and_f1": (accuracy + f1) / 2}
        )
    for task in ("sst-2", "mnli", "qnli", "rte", "wnli"):
        assert compute_metrics(task, PREDICTIONS, LABELS) == {"acc": pytest.approx(accuracy)}
    # no positive label or prediction: F1 is 0, as sklearn's zero_division=0 gives
    assert compute_metrics("mrpc", [0, 0], [0, 0]) == {"acc": 1.0, "f1": 0.0, "acc_and_f1": 0.5}
    assert compute_metrics("mrpc", [1, 0], [0, 0])["f1"] == 0.0


def test_metrics_take_logits_and_tensors():
    logits = torch.tensor([[0.1, 2.0, 0.3], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert compute_metrics("mnli", logits, torch.tensor([1, 0, 0])) == {"acc": pytest.approx(2 / 3)}


def test_regression_metrics_by_hand():
    predictions, labels = [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 5.0]
    # deviations from the means 2.5 and 2.75: products sum to 6.5, squares to 5 and 8.75
    pearson = 6.5 / math.sqrt(5 * 8.75)
    result = compute_metrics("sts-b", np.array(predictions)[:, None], labels)  # (n, 1) as the regressor gives
    assert result == pytest.approx({"pearson": pearson, "spearmanr": 1.0, "corr": (pearson + 1.0) / 2})
    # ranks differ by 0, 1, -1, 0: rho = 1 - 6 * 2 / (4 * (16 - 1))
    assert compute_metrics("stsb", [1.0, 3.0, 2.0, 4.0], [1.0, 2.0, 3.0, 4.0])["spearmanr"] == pytest.approx(0.8)


def test_metrics_refuse_unlabelled_and_mismatched():
    with pytest.raises(ValueError, match="unlabelled"):
        compute_metrics("rte", [0, 1], [0, -1])
    with pytest.raises(ValueError, match="unlabelled"):
        compute_metrics("sts-b", [0.0, 1.0, 2.0], [0.0, math.nan, 1.0])
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        compute_metrics("rte", [0, 1, 1], [0, 1])


def test_submission_file_names():
    names = {(task, split): submission_file_name(task, split) for task in EXPECTED for split in PROCESSORS[task].test}
    names[("ax", "test")] = submission_file_name("ax", "test")
    assert sorted(names.values()) == sorted(
        [
            "CoLA.tsv",
            "SST-2.tsv",
            "MRPC.tsv",
            "STS-B.tsv",
            "QQP.tsv",
            "MNLI-m.tsv",
            "MNLI-mm.tsv",
            "QNLI.tsv",
            "RTE.tsv",
            "WNLI.tsv",
            "AX.tsv",
        ]
    )
    assert names[("mnli", "test_mismatched")] == "MNLI-mm.tsv"
    assert submission_file_name("MNLI", "test_matched") == "MNLI-m.tsv"
    with pytest.raises(ValueError, match="MNLI has no test split 'test'"):
        submission_file_name("mnli", "test")


def test_write_classification_submission(glue_dir, tmp_path):
    processor = PROCESSORS["mnli"]
    (example,) = processor.test_sets(glue_dir / "MNLI")["test_mismatched"]
    path = tmp_path / submission_file_name("mnli", "test_mismatched")
    path.write_text("stale", encoding="utf-8")
    logits = torch.tensor([[0.0, 1.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    write_submission(path, processor, [example.guid, "1", "2"], logits)
    assert path.read_text(encoding="utf-8") == "index\tprediction\n0\tentailment\n1\tcontradiction\n2\tneutral\n"
    assert not list(tmp_path.glob("*.tmp"))


def test_write_stsb_submission_clips_scores(tmp_path):
    path = tmp_path / "STS-B.tsv"
    write_submission(path, "sts-b", ["0", "1", "2"], np.array([[-0.4], [2.3456], [5.7]]))
    assert path.read_text(encoding="utf-8") == "index\tprediction\n0\t0.000\n1\t2.346\n2\t5.000\n"


class Unprintable:
    def __format__(self, spec):
        raise RuntimeError("disk full")


def test_failed_submission_leaves_old_file(tmp_path):
    path = tmp_path / "RTE.tsv"
    path.write_text("old", encoding="utf-8")
    with pytest.raises(ValueError, match="1 predictions for 2 examples"):
        write_submission(path, "rte", ["0", "1"], [1])
    with pytest.raises(RuntimeError, match="disk full"):  # fails half-way through writing
        write_submission(path, "rte", ["0", Unprintable()], [1, 0])
    assert path.read_text(encoding="utf-8") == "old"
    assert os.listdir(tmp_path) == ["RTE.tsv"]
