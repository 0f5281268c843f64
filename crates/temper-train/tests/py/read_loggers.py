#!/usr/bin/env python3
"""Reads a run's TensorBoard events (with tensorboard's EventAccumulator) and its offline W&B run
(the run-*.wandb transaction log, whose records are wandb's own `Record` protobufs) and prints
what they hold as JSON: {"tensorboard": {tag: [[step, value], ...]},
"wandb": {"history": [{...}, ...], "config": {...}, "images": [key, ...]}}.

Usage: python read_loggers.py RUN_DIR
"""
import glob
import json
import os
import struct
import sys
import zlib

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2


def tensorboard_scalars(run):
    acc = EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def transaction_log(path):
    """The records of a W&B transaction log: LevelDB's log format in 32 KiB blocks after a
    7-byte header (":W&B", magic 0xBEE1, version 0); each chunk is a CRC-32 of its type byte
    and data, a 2-byte length, a type (1 whole, 2 first, 3 middle, 4 last) and the data."""
    blob = open(path, "rb").read()
    assert blob[:4] == b":W&B", "not a W&B transaction log"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(blob):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a chunk header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", blob[pos:pos + 7])
        data = blob[pos + 7:pos + 7 + length]
        if kind == 0 and length == 0:
            break
        assert zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"bad CRC at {pos}"
        pos += 7 + length
        pending += data
        if kind in (1, 4):
            yield pending
            pending = b""


def wandb_records(run):
    (path,) = glob.glob(os.path.join(run, "wandb", "offline-run-*", "run-*.wandb"))
    history, config, images = [], {}, []
    for data in transaction_log(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for item in rec.history.item:
                path = [item.key] if item.key else list(item.nested_key)
                value = json.loads(item.value_json)
                if len(path) == 1:
                    row[path[0]] = value
                elif path[-1] == "_type" and value == "image-file":
                    # An image is logged as its fields: [name, "_type"], [name, "path"], ...
                    images.append(path[0])
            history.append(row)
        elif kind == "config":
            for item in rec.config.update:
                key = item.key or "/".join(item.nested_key)
                config[key] = json.loads(item.value_json)
        elif kind == "run":
            for item in rec.run.config.update:
                key = item.key or "/".join(item.nested_key)
                config[key] = json.loads(item.value_json)
    return {"history": history, "config": config, "images": images}


def main():
    run = sys.argv[1]
    print(json.dumps({"tensorboard": tensorboard_scalars(run), "wandb": wandb_records(run)}))


if __name__ == "__main__":
    main()
