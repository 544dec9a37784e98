"""Transformers sequence-classification models made on the spot for tests and benchmarks: random weights and a
WordPiece tokenizer trained on the given texts, saved as transformers saves a model. Nothing is downloaded."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def random_bert(
    folder: Path,
    texts: Iterable[str],
    *,
    hidden: int,
    layers: int,
    vocab_size: int,
    max_positions: int = 512,
    seed: int = 0,
) -> Path:
    """A BERT of `layers` layers of width `hidden` with a regression head (one label, as FineWeb-Edu's classifier),
    its weights drawn with `seed`."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=fast.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 2),
        intermediate_size=4 * hidden,
        max_position_embeddings=max_positions,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder
