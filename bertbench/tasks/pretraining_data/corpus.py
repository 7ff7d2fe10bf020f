"""create_pretraining_data's input, Google's text format (one sentence per line, a blank line between documents),
read as a stream of chunks of documents, so that memory does not grow with the corpus."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence

from bertbench.tasks.pretraining_data.settings import DataError


def resolve_input_files(patterns: str) -> list[str]:
    """Google's --input_file: comma-separated files or glob patterns, each of which must name something."""
    paths: list[str] = []
    for pattern in filter(None, (part.strip() for part in patterns.split(","))):
        # Sorted: the output must not depend on the directory's order. A name with "[" may be a file, not a pattern.
        matches = sorted(glob.glob(pattern)) or ([pattern] if os.path.exists(pattern) else [])
        if not matches:
            raise DataError(f"--input_file {pattern}: no such file")
        for path in matches:
            if not os.path.isfile(path):
                raise DataError(f"--input_file {path}: not a file")
            if not os.access(path, os.R_OK):
                raise DataError(f"--input_file {path}: not readable")
        paths.extend(matches)
    if not paths:
        raise DataError("--input_file names no file")
    return paths


class CorpusReader:
    """Documents (lists of stripped non-blank lines) in chunks of about `chunk_bytes` of text; counts what it read
    so that progress can be shown while the chunks are being worked on."""

    def __init__(self, paths: Sequence[str], chunk_bytes: float):
        self.paths, self.chunk_bytes = paths, chunk_bytes
        self.bytes_read = self.sentences = self.documents = 0

    def chunks(self) -> Iterator[list[list[str]]]:
        chunk: list[list[str]] = []
        chunk_start = 0  # bytes read before the chunk's first line
        for path in self.paths:
            for document in self._documents(path):
                chunk.append(document)
                if self.bytes_read - chunk_start >= self.chunk_bytes:
                    yield chunk
                    chunk, chunk_start = [], self.bytes_read
        if chunk:
            yield chunk

    def _documents(self, path: str) -> Iterator[list[str]]:
        """A file's documents; the last one ends with the file (Google's would run on into the next file)."""
        document: list[str] = []
        with open(path, "rb") as handle:
            for line_number, raw in enumerate(handle, 1):
                self.bytes_read += len(raw)
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as error:
                    raise DataError(
                        f"{path}:{line_number}: not valid UTF-8 ({error.reason} at byte {error.start + 1} of the line)"
                    ) from None
                if line:
                    document.append(line)
                    self.sentences += 1
                elif document:
                    self.documents += 1
                    yield document
                    document = []
        if document:
            self.documents += 1
            yield document
