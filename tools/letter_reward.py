#!/usr/bin/env python3
"""A reward for runs of random-weight models (`reward.name = "command"`, `reward.kwargs.cmd =
["python3", "tools/letter_reward.py"]`): the share of the completion's characters that are ASCII
letters. A random model never answers a task, so a task's reward is 0 for every sample, every
advantage is 0 and the trainer skips every update; this one varies from sample to sample, so
each step updates. scripts/gpu-check.sh uses it where SmolLM2's real weights are not there.
Protocol (temper's command reward): one JSON request per stdin line, one {"reward": r} per line.
"""
import json
import sys

for line in sys.stdin:
    text = json.loads(line).get("completion", "")
    letters = sum(c.isascii() and c.isalpha() for c in text)
    print(json.dumps({"reward": letters / max(1, len(text))}), flush=True)
