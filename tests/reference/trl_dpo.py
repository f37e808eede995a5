"""TRL's DPOTrainer, run as a careful user would for an exact comparison:
`python -m torch.distributed.run --nproc-per-node W trl_dpo.py --model DIR
--data FILE.jsonl --out RESULT.json --steps N ...`. One pair per rank and
micro-step, the pairs in file order (train_sampling_strategy="sequential"),
fp32, AdamW at a constant rate, no dropout (DPOTrainer's default), the
reference model the starting one (a frozen copy; with --adapter the base
with the adapters off). RESULT.json (rank 0) holds the per-step losses and
the metrics TRL logs (rewards, accuracies, margins), and the tokenized
pairs (prompt, chosen and rejected ids). `--jobs FILE` runs several, one
JSON list of these arguments a line, in the same processes.
"""
import json

import datasets
import torch
import transformers
import trl

import trl_run

LOGGED = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
          "logps/rejected")


class Logged(transformers.TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.steps.append({k: float(logs[k]) for k in LOGGED if k in logs})


def train(argv):
    parser = trl_run.parser(__doc__)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--loss-type", default="sigmoid")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    dataset = datasets.load_dataset("json", data_files=args.data, split="train")
    config = trl.DPOConfig(**trl_run.exact_settings(args), beta=args.beta, loss_type=[args.loss_type])
    model, tokenizer = trl_run.model_and_tokenizer(args.model, args.adapter)
    logged = Logged()
    trainer = trl.DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             callbacks=[logged])
    trainer.train()
    if trl_run.is_rank0():
        tokenized = [{k: list(map(int, row[k])) for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                     for row in trainer.train_dataset]
        with open(args.out, "w") as f:
            json.dump({"steps": logged.steps, "tokenized": tokenized}, f)


if __name__ == "__main__":
    trl_run.main(train)
