#!/usr/bin/env python3
"""Prints one column of a Parquet file (the format Hugging Face datasets
ship), or of an Arrow file (what `datasets`' save_to_disk writes), as JSON
strings, one document per line, for `fsdp data prepare`:

  tools/parquet_text.py FILE FIELD

or, for chat data, each row as one JSON object of its chat columns
(messages; prompt and completion; tools and chat_template_kwargs when
present), or whether the file holds such columns ("true"/"false"):

  tools/parquet_text.py FILE --records
  tools/parquet_text.py FILE --is-chat

Read a row group at a time, so a file larger than memory streams. A
missing or non-text column is refused naming the text columns there are
(exit 2), and a null value is skipped. Why Python: Parquet's encodings and
compressions are Apache Arrow's to read (pyarrow, in the venv
scripts/setup.sh makes); Debian ships no C++ Arrow. Training stays free of
Python: this runs once, while preparing data.
"""
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def reason(e):
    """pyarrow's exception as "Type: message" (some carry no message)."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class ArrowFile:
    """An Arrow IPC file (save_to_disk's data-NNNNN-of-NNNNN.arrow: the
    streaming format; the random-access one too), read as ParquetFile is."""

    def __init__(self, path):
        self.source = pa.memory_map(path)
        try:
            self.batches = pa.ipc.open_stream(self.source)
            self.schema_arrow = self.batches.schema
        except pa.ArrowInvalid:
            self.source.seek(0)
            reader = pa.ipc.open_file(self.source)
            self.schema_arrow = reader.schema
            self.batches = (reader.get_batch(i) for i in range(reader.num_record_batches))

    def iter_batches(self, columns):
        for batch in self.batches:
            yield pa.RecordBatch.from_arrays([batch.column(c) for c in columns], names=columns)


def main():
    path, field = sys.argv[1], sys.argv[2]
    arrow = path.endswith(".arrow")
    try:
        parquet = ArrowFile(path) if arrow else pq.ParquetFile(path)
        schema = parquet.schema_arrow
    except Exception as e:  # noqa: BLE001 - any unreadable file is named, not a traceback
        sys.exit(f"error: '{path}' is not {'an Arrow' if arrow else 'a Parquet'} file ({reason(e)})")
    try:
        read(path, field, parquet, schema)
    except Exception as e:  # noqa: BLE001 - a damaged page or row group is named with its file
        sys.exit(f"error: '{path}' is damaged: reading its column \"{field}\" failed ({reason(e)})")


def is_text(t):
    """A string column, also dictionary-encoded (as datasets often are)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or (pa.types.is_dictionary(t) and is_text(t.value_type))


CHAT_COLUMNS = ("messages", "prompt", "completion", "tools", "chat_template_kwargs")


def is_chat(schema):
    return "messages" in schema.names or ("prompt" in schema.names and "completion" in schema.names)


def read_records(path, parquet, schema):
    if not is_chat(schema):
        print(f"error: '{path}' has no \"messages\" column, nor \"prompt\" and \"completion\" columns "
              f"(its columns: {', '.join(schema.names)}); expected chat data beside the other chat data",
              file=sys.stderr)
        sys.exit(2)
    columns = [c for c in CHAT_COLUMNS if c in schema.names]
    out = sys.stdout
    for batch in parquet.iter_batches(columns=columns):
        for row in batch.to_pylist():
            out.write(json.dumps({c: row[c] for c in columns if row[c] is not None}, ensure_ascii=False))
            out.write("\n")


def read(path, field, parquet, schema):
    if field == "--is-chat":
        print("true" if is_chat(schema) else "false")
        return
    if field == "--records":
        read_records(path, parquet, schema)
        return
    texts = [f.name for f in schema if is_text(f.type)]
    if field not in schema.names or field not in texts:
        print(f"error: '{path}' has no text column \"{field}\"" +
              (f" (its text columns: {', '.join(texts)}; --text-field chooses one)" if texts else
               " (it has no text column)"), file=sys.stderr)
        sys.exit(2)
    out = sys.stdout
    for batch in parquet.iter_batches(columns=[field]):
        for value in batch.column(0).to_pylist():
            if value is not None:
                out.write(json.dumps(value, ensure_ascii=False))
                out.write("\n")


if __name__ == "__main__":
    main()
