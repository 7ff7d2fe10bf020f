"""Atomic writes (common.durable) and the one reader of the metrics log (training.metrics): what a crash or a kill
leaves, and what a reader makes of it."""

import os

import pytest

from bertbench.common.durable import atomic_output, is_temporary_name, move_files, write_atomically
from bertbench.training.metrics import MetricsLog, read_metrics, scan_log


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "eval_results.json"
    write_atomically(path, "old\n")
    write_atomically(path, b"new\n")
    assert path.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["eval_results.json"]


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(path) as temporary:
        with open(temporary, "w") as handle:
            handle.write("half of it")
        assert is_temporary_name(os.path.basename(temporary)) and os.path.dirname(temporary) == str(tmp_path)
        raise RuntimeError("the writer failed")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["trace.json"]


def test_moved_files_land_in_directories_made_for_them(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "shard.hdf5").write_bytes(b"data")
    move_files([(str(tmp_path / "work" / "shard.hdf5"), str(tmp_path / "out" / "len_128" / "shard.hdf5"))])
    assert (tmp_path / "out" / "len_128" / "shard.hdf5").read_bytes() == b"data"
    assert os.listdir(tmp_path / "work") == []


def test_a_torn_last_line_is_neither_a_record_nor_damage(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 4}\n\n{"step": 8}\n{"step": 12, "lo')
    assert read_metrics(tmp_path) == [{"step": 4}, {"step": 8}]
    assert scan_log(tmp_path / "metrics.jsonl").records == [(1, {"step": 4}), (3, {"step": 8})]


@pytest.mark.parametrize("damage", [b"\xff\xfe not text\n", b"[1, 2]\n", b'{"step": 6\n'])
def test_a_damaged_line_is_an_error_naming_the_line_for_a_reader_and_dropped_on_resume(tmp_path, damage):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 4}\n' + damage + b'{"step": 8}\n{"step": 12}\n')
    assert scan_log(path).damaged == [2]
    with pytest.raises(ValueError, match=f"^{path}: line 2 is not a JSON object in UTF-8$"):
        read_metrics(tmp_path)
    warnings = []
    MetricsLog(path, resume_step=8, log=warnings.append)
    assert read_metrics(tmp_path) == [{"step": 4}, {"step": 8}] and len(warnings) == 1


def test_no_log_reads_as_no_records(tmp_path):
    assert read_metrics(tmp_path) == [] and scan_log(tmp_path / "evals.jsonl").damaged == []
