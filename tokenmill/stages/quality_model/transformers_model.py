"""A transformers sequence-classification model (a regression head, as FineWeb-Edu's classifier, or two classes)
read from a local folder: batches of texts of similar length, on CUDA in bf16 when there is one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenmill.errors import ConfigError

BATCH_SIZE = 32  # texts per forward pass; length-sorted, so a batch pads to about its own length


class TransformersScorer:
    """The regression value (one output) or the probability of class 1 (two outputs) per text. On CUDA the
    weights are bf16, so its scores are expected within about 2e-2 of the CPU's float32 ones (bf16 keeps 8 bits of
    mantissa)."""

    def __init__(self, folder: Path, device: str, max_tokens: int):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("quality_model.device: 'cuda' asked for, but torch sees no CUDA device")
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.max_tokens = max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
        self.outputs = model.config.num_labels
        if self.outputs not in (1, 2):
            raise ConfigError(
                f"quality_model: {folder} has {self.outputs} outputs; a quality model has one (a regression "
                "value) or two (class 1's probability is the score)"
            )
        dtype = torch.bfloat16 if use_cuda else torch.float32
        self.model = model.to(device=self.device, dtype=dtype).eval()

    def score(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_tokens)["input_ids"]
        order = np.argsort([len(row) for row in ids], kind="stable")
        out = np.empty(len(texts), dtype=np.float32)
        on_cuda = self.device.type == "cuda"
        with torch.inference_mode():
            for start in range(0, len(order), BATCH_SIZE):
                chosen = order[start : start + BATCH_SIZE]
                padded = self.tokenizer.pad({"input_ids": [ids[i] for i in chosen]}, return_tensors="pt")
                batch = dict(padded)
                if on_cuda:  # pinned host memory: the copy to the device runs without a staging copy
                    batch = {k: v.pin_memory().to(self.device, non_blocking=True) for k, v in batch.items()}
                logits = self.model(**batch).logits.float()
                values = logits[:, 0] if self.outputs == 1 else torch.softmax(logits, dim=-1)[:, 1]
                out[chosen] = values.cpu().numpy()
        return out
