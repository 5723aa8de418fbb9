"""Image + question -> answer samples as model inputs, through the model's own chat template and image
processor; CPU only (it runs in DataLoader workers, E001).

Why not AutoProcessor: without torchvision, `Qwen2VLProcessor` cannot be built (its video processor) and
AutoProcessor quietly returns a bare tokenizer. This module does the one thing a processor does for us:
replace each image placeholder with as many image tokens as the image yields, which depends on the
image's size and aspect ratio, so it is computed per image, never assumed.

Public API (host preflight imports it, V001/V002):
    ImageTextProcessor.from_pretrained(path) / (tokenizer, image_processor, config)
    .encode(sample, max_seq_length) -> EncodedSample (input_ids, labels, images' tensors) or raises
        DataSourceError("V001") when prompt + image tokens do not fit max_seq_length.
    .collate(encoded) -> the model's batch (padded ids, labels, attention mask, pixel values, grids).
    view_mismatch(config, image_processor) -> the V002 message, or None.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flightdeck.worker.train.data_errors import DataSourceError
from flightdeck.worker.train.quoting import quote

IGNORE_INDEX = -100
# A blank image stands in for a missing one when every rank must run the tower (V003).
BLANK_IMAGE_SIZE = (56, 56)


def load_image(value: Any, *, row: int | None = None) -> Any:
    """A PIL image (RGB) from a path, raw bytes, or an HF struct {bytes, path}.

    A missing or undecodable image is a data finding (D008) naming the row and (a short prefix of) the
    file, never an exception that fails the agent without saying which file.
    """
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, Mapping):
        value = value.get("bytes") or value.get("path")
    where = f"row {row}: " if row is not None else ""
    if isinstance(value, (bytes, bytearray)):
        try:
            return Image.open(io.BytesIO(value)).convert("RGB")
        except (OSError, SyntaxError, ValueError) as exc:
            raise DataSourceError(
                "D008",
                f"{where}the image bytes ({len(value)} bytes, byte offset 0) cannot be decoded "
                f"({type(exc).__name__})",
                fix=f"{where}store a complete PNG or JPEG in the image's bytes, or drop the row",
            ) from exc
    if isinstance(value, (str, Path)):
        if not Path(value).is_file():
            raise DataSourceError(
                "D008",
                f"{where}image file {quote(Path(value).name)} does not exist (relative paths are read from the "
                "dataset's folder)",
                fix=f"{where}put {quote(Path(value).name)} where the row's image path points, or correct "
                "the path (a relative one is read from the dataset file's folder), or drop the row",
            )
        try:
            with Image.open(value) as image:
                return image.convert("RGB")
        except (OSError, SyntaxError, ValueError) as exc:
            raise DataSourceError(
                "D008",
                f"{where}image file {quote(Path(value).name)} ({Path(value).stat().st_size} bytes) cannot be "
                f"decoded from byte offset 0 ({type(exc).__name__})",
                fix=f"{where}replace {quote(Path(value).name)} with a complete PNG or JPEG, or drop the row",
            ) from exc
    raise DataSourceError(
        "D001",
        f"{where}cannot read an image from a {type(value).__name__}",
        fix="give the image column a path, the image's bytes, or {bytes, path} (the datasets Image feature)",
    )


def blank_image() -> Any:
    from PIL import Image

    return Image.new("RGB", BLANK_IMAGE_SIZE, "white")


@dataclass
class EncodedSample:
    input_ids: list[int]
    labels: list[int]
    image_inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def image_tokens(self) -> int:
        return len(self.input_ids) - len([i for i in self.labels if i != IGNORE_INDEX])


def processor_chat_template(path: str | Path) -> str | None:
    """The chat template a checkpoint keeps beside its processor (chat_template.jinja / .json), if any."""
    import json

    directory = Path(path)
    jinja, packed = directory / "chat_template.jinja", directory / "chat_template.json"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    if packed.is_file():
        template = json.loads(packed.read_text(encoding="utf-8")).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def view_mismatch(config: Mapping[str, Any], image_processor: Any) -> str | None:
    """V002: the image processor produces views the model's tower was not built for."""
    vision = config.get("vision_config") or {}
    if config.get("model_type") in ("qwen2_vl", "qwen2_5_vl"):
        pairs = [
            ("patch_size", "patch_size"),
            ("temporal_patch_size", "temporal_patch_size"),
            ("merge_size", "spatial_merge_size"),
        ]
        for proc_key, config_key in pairs:
            have, want = getattr(image_processor, proc_key, None), vision.get(config_key)
            if have is not None and want is not None and have != want:
                return (
                    f"the image processor's {proc_key} is {have} but the model's vision_config.{config_key} "
                    f"is {want}: every image would give the tower views of the wrong shape. Set "
                    f"{proc_key}={want} in preprocessor_config.json (or use the model's own processor)"
                )
        return None
    size = getattr(image_processor, "size", None) or {}
    want = vision.get("image_size")
    have = [size.get(k) for k in ("height", "width", "shortest_edge") if size.get(k)]
    if want and have and any(h != want for h in have):
        return (
            f"the image processor resizes to {have} pixels but the model's vision_config.image_size is "
            f"{want}: the tower expects {want}x{want} views. Set size to {want} in preprocessor_config.json"
        )
    return None


class ImageTextProcessor:
    """Chat template + tokenizer + image processor for one vision-language architecture."""

    def __init__(self, tokenizer: Any, image_processor: Any, config: Mapping[str, Any]):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.model_type = str(config.get("model_type"))
        self.qwen = self.model_type in ("qwen2_vl", "qwen2_5_vl")
        self.image_token = "<|image_pad|>" if self.qwen else "<image>"
        self.image_token_id = int(
            config.get("image_token_id") or tokenizer.convert_tokens_to_ids(self.image_token)
        )
        self.vision_config = dict(config.get("vision_config") or {})
        self.select_strategy = config.get("vision_feature_select_strategy", "default")
        if tokenizer.chat_template is None:
            raise DataSourceError(
                "D010",
                "the model's tokenizer has no chat_template; vision_language needs one to place images",
                fix="use a checkpoint whose tokenizer_config.json or chat_template.jinja has a chat template "
                "(the instruct or chat variant), or add one to the model directory",
            )

    @classmethod
    def from_pretrained(cls, path: str | Path, **image_kwargs: Any) -> ImageTextProcessor:
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

        config = AutoConfig.from_pretrained(path).to_dict()
        image_processor = AutoImageProcessor.from_pretrained(path, **image_kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.chat_template is None:
            tokenizer.chat_template = processor_chat_template(path)
        return cls(tokenizer, image_processor, config)

    # --- one sample ------------------------------------------------------------------------------

    def tokens_per_image(self, image_inputs: Mapping[str, Any], index: int) -> int:
        if self.qwen:
            merge = int(getattr(self.image_processor, "merge_size", 2))
            return int(image_inputs["image_grid_thw"][index].prod()) // (merge * merge)
        patches = (int(self.vision_config["image_size"]) // int(self.vision_config["patch_size"])) ** 2
        has_cls = self.vision_config.get("model_type") == "clip_vision_model"
        return patches + (1 if has_cls and self.select_strategy == "full" else 0)

    def _texts(self, question: str, answer: str, images: int) -> tuple[str, str]:
        user = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": question}]
        prompt_turn = [{"role": "user", "content": user}]
        full_turns = [*prompt_turn, {"role": "assistant", "content": [{"type": "text", "text": answer}]}]
        prompt = self.tokenizer.apply_chat_template(prompt_turn, tokenize=False, add_generation_prompt=True)
        full = self.tokenizer.apply_chat_template(full_turns, tokenize=False)
        if not full.startswith(prompt):
            raise DataSourceError(
                "D010",
                "the chat template does not end the user turn where the answer starts",
                fix="use a chat template whose render of the user turn with the generation prompt is the start "
                "of its render with the assistant's answer (the model's own template does)",
            )
        return prompt, full[len(prompt) :]

    def encode(self, sample: Mapping[str, Any], max_seq_length: int) -> EncodedSample:
        """input_ids and labels (only the answer supervised) and the image tensors of one sample."""
        images = [load_image(value, row=sample.get("row")) for value in sample.get("images") or []]
        prompt, answer = self._texts(
            str(sample.get("question", "")), str(sample.get("answer", "")), len(images)
        )
        image_inputs: dict[str, torch.Tensor] = {}
        if images:
            image_inputs = dict(self.image_processor(images=images, return_tensors="pt"))
            pieces = prompt.split(self.image_token)
            prompt = pieces[0] + "".join(
                self.image_token * self.tokens_per_image(image_inputs, i) + piece
                for i, piece in enumerate(pieces[1:])
            )
        prompt_ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        answer_ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        if len(prompt_ids) >= max_seq_length:
            raise DataSourceError(
                "V001",
                f"a sample needs {len(prompt_ids)} tokens before its answer (prompt + "
                f"{sum(1 for i in prompt_ids if i == self.image_token_id)} image tokens) but max_seq_length "
                f"is {max_seq_length}: truncating would cut image tokens ('Image features and image tokens "
                "do not match')",
                fix=f"raise data.max_seq_length above {len(prompt_ids)}, or shrink the images (data.max_pixels)",
            )
        input_ids = (prompt_ids + answer_ids)[:max_seq_length]
        labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_seq_length]
        return EncodedSample(input_ids, labels, image_inputs)

    # --- a batch ---------------------------------------------------------------------------------

    def collate(self, encoded: Sequence[EncodedSample]) -> dict[str, torch.Tensor]:
        width = max(len(e.input_ids) for e in encoded)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([e.input_ids + [pad] * (width - len(e.input_ids)) for e in encoded])
        batch = {
            "input_ids": ids,
            "attention_mask": torch.tensor(
                [[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in encoded]
            ),
            "labels": torch.tensor([e.labels + [IGNORE_INDEX] * (width - len(e.labels)) for e in encoded]),
        }
        with_images = [e.image_inputs for e in encoded if e.image_inputs]
        if with_images:
            for key in with_images[0]:
                batch[key] = torch.cat([inputs[key] for inputs in with_images])
        if self.qwen:
            # Qwen2-VL's M-RoPE needs to know which positions are image tokens (required in 5.x).
            batch["mm_token_type_ids"] = (ids == self.image_token_id).int()
        return batch
