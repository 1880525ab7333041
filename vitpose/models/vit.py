"""Plain ViT backbone of ViTPose: patch grid in, (N, C, H/16, W/16) feature map out.

Pre-norm transformer blocks (LayerNorm eps 1e-6, fused qkv, exact GELU, MLP ratio 4), an
absolute position embedding over the patch grid (no class token) and a final LayerNorm.
Parameter names follow timm; vitpose.models.layouts maps MMPose / official / HF names here.
docs/model.md §1 lists where each detail comes from.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def drop_path(x, drop_prob: float = 0.0, training: bool = False):
    """Stochastic depth: zero whole samples of a residual branch, rescale the survivors."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1.0 - drop_prob
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep_prob)
    return x * mask.div_(keep_prob)


def init_layers(module: nn.Module, weight_types, init_weight, norm_types) -> None:
    """Every submodule of `weight_types`: `init_weight(weight)` and a zero bias; of `norm_types`:
    weight 1, bias 0. (The backbone and the heads differ only in the types and the weight rule.)"""
    for m in module.modules():
        if isinstance(m, weight_types):
            init_weight(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, norm_types):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class DropPath(nn.Module):
    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)

    def extra_repr(self):
        return f"drop_prob={self.drop_prob:.3f}"


class PatchEmbed(nn.Module):
    """16x16 stride-16 conv with padding 2: the grid is shifted 2 px up-left (docs/model.md §1.2)."""

    def __init__(self, img_size=(256, 192), patch_size=16, padding=2, in_chans=3, embed_dim=768):
        super().__init__()
        self.img_size = tuple(img_size)
        self.patch_size = patch_size
        self.padding = padding
        self.grid_size = self.output_grid(self.img_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, padding=padding)

    def output_grid(self, img_size):
        p, pad = self.patch_size, self.padding
        return tuple((s + 2 * pad - p) // p + 1 for s in img_size)

    def forward(self, x):
        return self.proj(x)  # (N, C, Hp, Wp)


class Attention(nn.Module):
    def __init__(self, dim, num_heads, qkv_bias=True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        # qkv rows are [q | k | v], each head-major: (B, N, 3, heads, hd) -> 3 x (B, heads, N, hd)
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()  # exact (erf), as the original
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop_path=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x):
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def resize_pos_embed(pos_embed, old_grid, new_grid):
    """Bicubic resize of a (1, H*W, C) grid embedding (align_corners=False, as timm/MMPose)."""
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    C = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, old_grid[0], old_grid[1], C).permute(0, 3, 1, 2)
    grid = F.interpolate(grid.float(), size=tuple(new_grid), mode="bicubic", align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], C).to(pos_embed.dtype)


class VisionTransformer(nn.Module):
    """ViTPose backbone. `forward(x)` -> (N, embed_dim, H/16, W/16), after the final LayerNorm.

    Inputs of another size than `img_size` work: the position embedding is resized bicubically.
    `grad_checkpointing=True` recomputes each block in backward (less memory; each block's forward runs twice).
    """

    def __init__(
        self,
        img_size=(256, 192),
        patch_size=16,
        patch_padding=2,
        embed_dim=768,
        depth=12,
        num_heads=12,
        mlp_ratio=4.0,
        qkv_bias=True,
        drop_path_rate=0.0,
        grad_checkpointing=False,
        in_chans=3,
    ):
        super().__init__()
        self.embed_dim = self.num_features = embed_dim
        self.depth = depth
        self.grad_checkpointing = grad_checkpointing
        self.patch_embed = PatchEmbed(img_size, patch_size, patch_padding, in_chans, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
        # linspace(0, drop_path_rate, depth) in float64, as mmpretrain's np.linspace
        rates = [drop_path_rate * i / (depth - 1) if depth > 1 else 0.0 for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_path=rates[i]) for i in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        # timm / official ViTPose: trunc_normal(0.02) Linear weights and pos_embed, zero biases,
        # LayerNorm (1, 0); the patch conv keeps PyTorch's default init.
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        init_layers(self, nn.Linear, lambda w: nn.init.trunc_normal_(w, std=0.02), nn.LayerNorm)

    @torch.jit.ignore
    def no_weight_decay(self):
        return {"pos_embed"}

    def set_grad_checkpointing(self, enable=True):
        self.grad_checkpointing = enable

    def _pos_embed(self, grid):
        return resize_pos_embed(self.pos_embed, self.patch_embed.grid_size, grid)

    def forward(self, x):
        x = self.patch_embed(x)
        N, C, Hp, Wp = x.shape
        # (N, Hp*Wp, C) tokens, row-major. Made contiguous once here: otherwise the residual
        # stream inherits the conv's channel-major strides and every LayerNorm / Linear copies.
        x = x.flatten(2).transpose(1, 2).contiguous() + self._pos_embed((Hp, Wp))
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        x = self.norm(x)
        return x.transpose(1, 2).reshape(N, C, Hp, Wp)


__all__ = ["Attention", "Block", "DropPath", "Mlp", "PatchEmbed", "VisionTransformer", "resize_pos_embed"]
