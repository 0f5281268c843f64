"""Writes tests/fixtures/verl_style.parquet with pyarrow (independent of the Rust reader): verl's
layout, a chat-message `prompt` column and a nested `reward_model.ground_truth`, snappy-compressed.

Usage: make_parquet_fixture.py OUT.parquet
"""
import sys

import pyarrow as pa
import pyarrow.parquet as pq

rows = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"index": 0, "question": "What is 2 + 3?"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 10 - 4?"}],
        "reward_model": {"style": "rule", "ground_truth": "6"},
        "extra_info": {"index": 1, "question": "What is 10 - 4?"},
    },
]
pq.write_table(pa.Table.from_pylist(rows), sys.argv[1], compression="snappy")
