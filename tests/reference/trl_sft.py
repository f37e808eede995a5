"""TRL's SFTTrainer, run as a careful user would for an exact comparison:
`python -m torch.distributed.run --nproc-per-node W trl_sft.py --model DIR
--data FILE.jsonl --out LOSSES.json --steps N ...`. Batch 1 per rank, the
data in file order (train_sampling_strategy="sequential"), fp32, AdamW with
a constant learning rate; the per-step training losses (TRL's log: the
mean over every rank's trained tokens) go to LOSSES.json on rank 0, and the
tokenized dataset (input_ids, completion_mask) beside it. With --adapter
DIR the model is the base with that PEFT LoRA adapter, trainable (the rest
frozen), and --save-adapter writes the trained adapter; with
--assistant-only-loss conversations train on their assistant turns (the
template's {% generation %} spans). `--jobs FILE`,
FILE holding one JSON list of these arguments a line, runs each in turn
in the same processes (one start of Python, TRL and the process group for
all of them), each from a fresh model and seed.
"""
import json

import datasets
import torch
import transformers
import trl

import trl_run


class Losses(transformers.TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def train(argv):
    parser = trl_run.parser(__doc__)
    parser.add_argument("--save-adapter", help="where the trained adapter goes (rank 0)")
    parser.add_argument("--assistant-only-loss", action="store_true",
                        help="conversations: the loss on the template's {% generation %} spans")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    dataset = datasets.load_dataset("json", data_files=args.data, split="train")
    config = trl.SFTConfig(**trl_run.exact_settings(args), packing=False,
                           assistant_only_loss=args.assistant_only_loss)
    model, tokenizer = trl_run.model_and_tokenizer(args.model, args.adapter)
    losses = Losses()
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             callbacks=[losses])
    trainer.train()
    if trl_run.is_rank0():
        # The completion mask is folded into the labels (-100 outside it).
        tokenized = [{"input_ids": list(map(int, row["input_ids"])),
                      "completion_mask": [int(label != -100) for label in row["labels"]]}
                     for row in trainer.train_dataset]
        if args.save_adapter:
            trainer.model.save_pretrained(args.save_adapter)
        with open(args.out, "w") as f:
            json.dump({"losses": losses.losses, "tokenized": tokenized}, f)


if __name__ == "__main__":
    trl_run.main(train)
