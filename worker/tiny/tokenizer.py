"""The tiny models' tokenizer: byte-level BPE trained on the fly on the demo corpus (no download)."""

from __future__ import annotations

from flightdeck.worker.tiny.demo_data import corpus_lines

_VOCAB_SIZE = 512
_DIGITS = " ".join(str(n) for n in range(100))


def train_tokenizer(arch: str = "llama", *, extra_specials: tuple[str, ...] = (), bos: bool = True):  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer, so any text encodes without unknown tokens; `extra_specials` are added
    as special tokens (a vision model's markers); `bos` prepends <s> to every encoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if arch == "bert":
        specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
        specials["mask_token"] = "[MASK]"
    else:
        specials = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    tokenizer = Tokenizer(models.BPE(unk_token=specials["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=list(specials.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [
        *corpus_lines(500, seed=1),
        _DIGITS,
        "Question: Answer: What Which value colour infographic chart",
    ]
    tokenizer.train_from_iterator(text, trainer=trainer)
    if arch == "bert":
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
    elif bos:
        bos_id = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", bos_id)]
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=512, **specials)
    if extra_specials:
        fast.add_special_tokens({"additional_special_tokens": list(extra_specials)})
    return fast
