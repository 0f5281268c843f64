"""tinker-cookbook's off-policy distillation (`tinker_cookbook.distillation.train_off_policy`)
against a Tinker server, called as its module docstring shows: a supervised data set paired with
a teacher; each step the teacher's top-k prompt logprobs (`topk_prompt_logprobs`) become (N, K)
soft targets for `cross_entropy`. The cookbook ships no command line for it, so this is the
user's few lines. Prints the cookbook's own completion message; exit status 0 on success.

    TINKER_BASE_URL=... python tools/cookbook_off_policy_distill.py MODEL CONVERSATIONS.jsonl LOG_DIR
"""

import asyncio
import sys

from tinker_cookbook import model_info
from tinker_cookbook.distillation import train_off_policy
from tinker_cookbook.distillation.datasets import TeacherConfig
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


def main() -> None:
    model, conversations, log_path = sys.argv[1:4]
    renderer = model_info.get_recommended_renderer_name(model)
    data = FromConversationFileBuilder(
        file_path=conversations,
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=model, renderer_name=renderer, max_length=256, batch_size=4
        ),
    )
    config = train_off_policy.Config(
        learning_rate=1e-4,
        dataset_configs=[
            train_off_policy.DatasetWithTeacher(
                dataset_builder=data, teacher_config=TeacherConfig(base_model=model)
            )
        ],
        model_name=model,
        recipe_name="off_policy_distill_check",
        lora_rank=4,
        n_teacher_targets=8,
        batch_size=4,
        max_steps=2,
        save_every=0,
        eval_every=0,
        log_path=log_path,
    )
    asyncio.run(train_off_policy.main(config))


if __name__ == "__main__":
    main()
