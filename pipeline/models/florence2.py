"""`florence2`: the DaViT vision tower and multimodal projector — pixels in, image tokens out.

The path of `Florence2Model.get_image_features`, built without the language model.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import Florence2Config
from transformers.models.florence2.modeling_florence2 import (
    Florence2MultiModalProjector,
    Florence2VisionBackbone,
)

from pipeline.models.spec import ConfigInt, ModelFamily

# The side of the square image both variants' preprocessors make.
IMAGE_SIZE = 768


class Florence2ImageEncoder(torch.nn.Module):
    """pixel_values (B, 3, H, W) -> image tokens (B, (H/32)*(W/32) + 1, projection_dim)."""

    def __init__(self, config: Florence2Config) -> None:
        super().__init__()
        self.vision_tower = Florence2VisionBackbone(config.vision_config)
        self.multi_modal_projector = Florence2MultiModalProjector(config)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self.vision_tower(pixel_values).last_hidden_state
        return self.multi_modal_projector(features)


def synthetic_image(size: int, seed: int) -> torch.Tensor:
    """A smooth RGB test card (H, W, 3) of uint8 values: gradients, a ring and a soft blob."""
    gen = torch.Generator().manual_seed(seed)
    phase = float(torch.rand((), generator=gen)) * 2 * math.pi
    # The blob's centre stays inside the middle 60% of the frame.
    cx, cy = (0.2 + 0.6 * torch.rand(2, generator=gen)).tolist()
    y, x = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    r = torch.sqrt((x - cx) ** 2 + (y - cy) ** 2)
    red = 0.5 + 0.5 * torch.sin(2 * math.pi * (1.5 * x + 0.5 * y) + phase)
    green = 0.5 + 0.5 * torch.cos(12 * math.pi * r)
    blue = torch.exp(-((r / 0.25) ** 2)) * 0.8 + 0.2 * y
    image = torch.stack([red, green, blue], dim=-1)
    return (image * 255).round().clamp(0, 255).to(torch.uint8)


def make_inputs(config: Florence2Config, preprocessor: dict[str, Any], seed: int) -> tuple[torch.Tensor]:
    # As Florence-2's image processor does: resize (already at size), rescale, normalize.
    image = synthetic_image(preprocessor["image_size"], seed).to(torch.float32) * preprocessor["rescale_factor"]
    mean = torch.tensor(preprocessor["image_mean"])
    std = torch.tensor(preprocessor["image_std"])
    pixel_values = ((image - mean) / std).permute(2, 0, 1).unsqueeze(0).contiguous()
    return (pixel_values,)


FAMILY = ModelFamily(
    name="florence2",
    variants=("base", "large"),
    default_variant="base",
    model_type="florence2",
    config_class=Florence2Config,
    make_module=Florence2ImageEncoder,
    make_inputs=make_inputs,
    signature=lambda c: (
        tuple(c.vision_config.embed_dim), tuple(c.vision_config.depths), tuple(c.vision_config.num_heads),
        tuple(c.vision_config.num_groups), c.vision_config.window_size, c.vision_config.projection_dim,
    ),
    hidden_size=lambda c: c.vision_config.projection_dim,
    sizes=(
        # One entry per stage.
        ConfigInt("vision_config.embed_dim"), ConfigInt("vision_config.num_heads"),
        ConfigInt("vision_config.num_groups"), ConfigInt("vision_config.depths", repeats=True),
        ConfigInt("vision_config.patch_size"), ConfigInt("vision_config.patch_stride"),
        ConfigInt("vision_config.patch_padding", minimum=0, below="vision_config.patch_size"),
        # Windows pad the feature map to a multiple of their size: none wider than the image.
        ConfigInt("vision_config.window_size", below=IMAGE_SIZE + 1),
        ConfigInt("vision_config.in_channels"), ConfigInt("vision_config.projection_dim"),
        ConfigInt("vision_config.max_position_embeddings"), ConfigInt("vision_config.max_temporal_embeddings"),
    ),
    divides=(("vision_config.num_heads", "vision_config.embed_dim"),
             ("vision_config.num_groups", "vision_config.embed_dim")),
)
