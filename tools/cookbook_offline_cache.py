"""An offline Hugging Face cache that tinker-cookbook's recipes read unchanged.

The recipes name a hub model (`Qwen/Qwen3-4B-Instruct-2507`) and hub datasets (`openai/gsm8k`,
`HuggingFaceH4/no_robots`, ...), and no hub is reachable here. This writes, under HF_HOME:

- `hub/models--ORG--NAME/snapshots/<rev>/`: links to a local model folder, so that the cookbook's
  tokenizer (AutoTokenizer) and `temper serve` (which resolves ORG/NAME in the same cache) load it.
- `datasets/ORG___NAME/CONFIG/0.0.0/<hash>/`: what `datasets.load_dataset(ORG/NAME)` reads when
  HF_DATASETS_OFFLINE=1 (its "latest cached version" path): arrow files and dataset_info.json.

`openai/gsm8k` is the real GSM8K (from ../shared/data). The other datasets are stand-ins with the
same fields, filled with GSM8K's problems and solutions (text other people wrote): the recipes
run their own code on them; what they learn is GSM8K, not the original data set.

    python tools/cookbook_offline_cache.py HF_HOME MODEL_DIR [--name ORG/NAME]...

(`--name` again links the same folder under another name: a recipe that also names a grader or
an opponent model; default Qwen/Qwen3-4B-Instruct-2507.)
"""

import argparse
import json
import os
from pathlib import Path

from datasets import Dataset, DatasetInfo, SplitDict, SplitInfo
from datasets.arrow_writer import ArrowWriter
from datasets.naming import camelcase_to_snakecase

REVISION = "0" * 40
CACHE_HASH = "temper-offline"
TRAIN_ROWS = 512
TEST_ROWS = 64


def link_model(hf_home: Path, name: str, model_dir: Path) -> None:
    org, repo = name.split("/")
    root = hf_home / "hub" / f"models--{org}--{repo}"
    snapshot = root / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(REVISION)
    for f in model_dir.iterdir():
        link = snapshot / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f.resolve())


def cache_dataset(hf_home: Path, repo_id: str, config: str, splits: dict) -> None:
    """Writes `splits` ({split: rows}) where load_dataset(repo_id, config) looks offline."""
    org, name = repo_id.split("/")
    name = camelcase_to_snakecase(name)
    folder = hf_home / "datasets" / f"{org}___{name}" / config / "0.0.0" / CACHE_HASH
    folder.mkdir(parents=True, exist_ok=True)
    split_dict = SplitDict(dataset_name=name)
    features = None
    for split, rows in splits.items():
        ds = Dataset.from_list(rows)
        features = ds.features
        with ArrowWriter(path=str(folder / f"{name}-{split}.arrow"), features=features) as w:
            w.write_table(ds.data.table)
            n, nbytes = w.finalize()
        split_dict.add(SplitInfo(name=split, num_bytes=nbytes, num_examples=n, dataset_name=name))
    info = DatasetInfo(features=features, builder_name="parquet", dataset_name=name,
                       config_name=config, splits=split_dict, version="0.0.0")
    info.write_to_directory(str(folder))


def gsm8k(data: Path, split: str, limit: int) -> list:
    with open(data / "gsm8k" / f"{split}.jsonl") as f:
        rows = [json.loads(line) for _, line in zip(range(limit), f)]
    return [{"question": r["question"], "answer": r["answer"]} for r in rows]


def standins(rows: list) -> dict:
    """The other data sets' fields, filled from GSM8K rows (each rejected answer is the next
    problem's solution)."""
    other = rows[1:] + rows[:1]
    return {
        ("HuggingFaceH4/no_robots", "default"): [
            {"prompt": r["question"], "prompt_id": str(i), "category": "Math",
             "messages": [{"role": "user", "content": r["question"]},
                          {"role": "assistant", "content": r["answer"]}]}
            for i, r in enumerate(rows)],
        ("allenai/tulu-3-sft-mixture", "default"): [
            {"id": f"gsm8k-{i}", "source": "gsm8k",
             "messages": [{"role": "user", "content": r["question"]},
                          {"role": "assistant", "content": r["answer"]}]}
            for i, r in enumerate(rows)],
        ("Anthropic/hh-rlhf", "default"): [
            {"chosen": f"\n\nHuman: {r['question']}\n\nAssistant: {r['answer']}",
             "rejected": f"\n\nHuman: {r['question']}\n\nAssistant: {o['answer']}"}
            for r, o in zip(rows, other)],
        ("zwhe99/DeepMath-103K", "default"): [
            {"question": r["question"], "final_answer": r["answer"].split("####")[-1].strip(),
             "difficulty": 1.0, "topic": "Mathematics -> Arithmetic"}
            for r in rows],
        ("open-thoughts/OpenThoughts3-1.2M", "default"): [
            {"conversations": [{"from": "human", "value": r["question"]},
                               {"from": "gpt", "value": r["answer"]}]}
            for r in rows],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_home", type=Path)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--name", action="append")
    ap.add_argument("--data", type=Path,
                    default=Path(__file__).resolve().parents[1].parent / "shared" / "data")
    args = ap.parse_args()
    names = args.name or ["Qwen/Qwen3-4B-Instruct-2507"]
    for name in names:
        link_model(args.hf_home, name, args.model_dir)
    # rl_numerics_check reads about 440,000 characters of wikitext: all of GSM8K's train split.
    everything = gsm8k(args.data, "train", 10**6)
    train, test = everything[:TRAIN_ROWS], gsm8k(args.data, "test", TEST_ROWS)
    cache_dataset(args.hf_home, "openai/gsm8k", "main", {"train": train, "test": test})
    cache_dataset(args.hf_home, "Salesforce/wikitext", "wikitext-103-raw-v1", {
        split: [{"text": line} for r in rows for line in (r["question"], r["answer"], "")]
        for split, rows in (("train", everything), ("test", test))})
    train_s, test_s = standins(train), standins(test)
    for (repo_id, config), rows in train_s.items():
        cache_dataset(args.hf_home, repo_id, config, {"train": rows, "test": test_s[(repo_id, config)]})
    print(json.dumps({"hf_home": str(args.hf_home), "models": names}))


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    main()
