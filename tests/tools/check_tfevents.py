#!/usr/bin/python3
"""Reads TensorBoard event files without fsdp.cpp's code: checks each
record's framing and masked CRC-32C (python3-crc32c), decodes each Event with
`protoc --decode_raw` (no schema), and compares the scalars with the JSON
lines of the run's metrics file. Prints one summary line; exits 1 on the
first mismatch.

usage: check_tfevents.py METRICS_JSONL EVENT_FILE [EVENT_FILE...]
"""
import json
import re
import struct
import subprocess
import sys

import crc32c


def masked(data):
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            sys.exit(f"{path}: truncated record header at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked(header):
            sys.exit(f"{path}: bad length CRC at byte {pos}")
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if len(body) != length or body_crc != masked(body):
            sys.exit(f"{path}: bad data CRC at byte {pos}")
        yield body
        pos += 16 + length


def decode(body):
    """(wall_time, step, file_version, {tag: value}) from protoc's raw text."""
    text = subprocess.run(["protoc", "--decode_raw"], input=body, capture_output=True, check=True).stdout.decode()
    wall = step = version = None
    values = {}
    tag = None
    depth = 0
    for line in text.splitlines():
        line = line.strip()
        if line.endswith("{"):
            depth += 1
            continue
        if line == "}":
            if depth == 2 and tag is not None:
                values.setdefault(tag, 0.0)  # proto3 leaves a zero out
            depth -= 1
            tag = None if depth < 2 else tag
            continue
        field, _, value = line.partition(": ")
        if depth == 0 and field == "1":
            wall = struct.unpack("<d", struct.pack("<Q", int(value, 16)))[0]
        elif depth == 0 and field == "2":
            step = int(value)
        elif depth == 0 and field == "3":
            version = json.loads(value)
        elif depth == 2 and field == "1":
            tag = json.loads(value)
        elif depth == 2 and field == "2":
            values[tag] = struct.unpack("<f", struct.pack("<I", int(value, 16)))[0]
    return wall, step or 0, version, values


def main():
    metrics_path, event_paths = sys.argv[1], sys.argv[2:]
    expected = {}
    for line in open(metrics_path):
        m = json.loads(line)
        if "event" in m or "step" not in m:
            continue
        prefix = m.get("split", "train") + "/"
        for key, value in m.items():
            if key == "step" or isinstance(value, str):
                continue
            expected[(m["step"], prefix + key)] = float(value)
    found = {}
    versions = 0
    for path in event_paths:
        for i, body in enumerate(records(path)):
            wall, step, version, values = decode(body)
            if i == 0:
                if version != "brain.Event:2":
                    sys.exit(f"{path}: first event has file_version {version!r}")
                versions += 1
                continue
            if wall is None or wall < 1e9:
                sys.exit(f"{path}: event {i} has wall_time {wall}")
            for tag, value in values.items():
                found[(step, tag)] = value
    for key, value in expected.items():
        if key not in found:
            sys.exit(f"step {key[0]} {key[1]}: in the metrics file, not in the event files")
        got = found[key]
        if abs(got - value) > 1e-6 * max(1.0, abs(value)) and not (value != value and got != got):
            sys.exit(f"step {key[0]} {key[1]}: {got} in the event files, {value} in the metrics file")
    extra = set(found) - set(expected)
    if extra:
        sys.exit(f"in the event files, not in the metrics file: {sorted(extra)[:3]}")
    print(f"ok: {len(event_paths)} files, {versions} file versions, {len(found)} scalars match the metrics file")


if __name__ == "__main__":
    main()
