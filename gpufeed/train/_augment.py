"""Training augmentation: which ops the loader's DALI graph runs, and the device module for the rest.

:func:`plan_augmentation` reads the ``augment`` config section and splits its ops by where each
runs (``augment.<op>.where``, see :class:`gpufeed.config.AugmentConfig`):

=========  =====================================================================================
place      what runs there
=========  =====================================================================================
loader     colour jitter, grayscale, flips inside the DALI graph
           (:class:`gpufeed.pipelines.LoaderAugment`, one 3x4 colour matrix per sample)
torch      the same three on the training device: :class:`FusedColour` (the loader's formula
           fed by ``torch.rand``, one batched pass) and :class:`RandomFlip`
kornia     every op, Kornia's implementation, in the step's precision
=========  =====================================================================================

The :class:`Augmenter` it returns (the device's share) takes and returns the loader's uint8
pixels: images ``(N, 3, H, W)`` or clips ``(N, 3, T, H, W)``, on whatever device they arrive, so
the model keeps its one input contract (uint8, normalised inside) in training, export and serving
alike. Kornia ops see float pixels in [0, 1] in ``dtype`` (the step's autocast precision on a GPU,
float32 on the CPU); the fused ops work on uint8 directly. Nothing here reads a value back to the
host: parameters are drawn on the device and applied with ``torch.where`` blends, so the host
keeps queueing work ahead of the GPU. Kornia's generators draw where their op was moved (the CPU
until then): a :class:`KorniaStage` moves them to its pixels' device at its first step, and each
op makes every parameter tensor there, including those Kornia would leave on the default device
(rotation's and erasing's: a copy to the host and back per op per step otherwise; about 0.4 ms
more host time per step for all six ops, measured on a CPU). A clip gets the same parameters on all of its frames
(``kornia.augmentation.VideoSequential`` with ``same_on_frame``; the fused ops draw per clip).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from gpufeed.config import AUGMENT_OPS, LOADER_AUGMENT_OPS, AugmentConfig
from gpufeed.pipelines import BASIS, DRAWS, ColourJitter, LoaderAugment, colour_coefficients

__all__ = [
    "AugmentPlan",
    "Augmenter",
    "FusedColour",
    "KorniaStage",
    "RandomFlip",
    "apply_colour",
    "build_augmenter",
    "build_op",
    "plan_augmentation",
]

_COLOUR_OPS = ("color_jitter", "grayscale")


class _DrawsOnItsDevice:
    """Mixin for a Kornia op: every tensor its parameters need is made on its generators' device.

    Where an op's config holds no tensor (rotation's degrees, erasing's scale and ratio), Kornia
    puts the parameters it has drawn on the process's default device, the CPU: on a GPU each step
    would copy them to the host (a synchronisation) and back, per op. Within this context the
    default device is the generators' own, for parameter generation only (a context costs a few
    microseconds per torch call it sees, so the transforms themselves run outside it).
    """

    device: torch.device

    def forward_parameters(self, batch_shape):
        with torch.device(self.device):
            return super().forward_parameters(batch_shape)


def _blur_on_device(input: torch.Tensor, kernel_size, sigma: torch.Tensor, border_type: str, separable: bool):
    """``kornia.filters.gaussian_blur2d`` on a GPU without its check that every sigma is positive.

    That check reads the sigmas back to the host (``bool(tensor)``), a synchronisation per step once
    they are drawn on the device (seen on an H200 with CUDA's sync debug mode). The sigmas come from
    ``augment.gaussian_blur.sigma``, a range the config already requires to be positive. Kornia's
    own kernels and separable filter do the rest; on a CPU Kornia's function runs unchanged.
    """
    from kornia.filters import gaussian_blur2d

    if input.device.type == "cpu":
        return gaussian_blur2d(input, kernel_size, sigma, border_type, separable)
    return _kernels_blur(input, kernel_size, sigma, border_type, separable)


def _kernels_blur(input: torch.Tensor, kernel_size, sigma: torch.Tensor, border_type: str, separable: bool):
    """Kornia's Gaussian kernels and filters applied as ``gaussian_blur2d`` does, reading nothing back."""
    if input.dtype in (torch.float16, torch.bfloat16):  # as Kornia: float32 kernels and passes, rounded once
        with torch.autocast(input.device.type, enabled=False):
            return _kernels_blur(input.float(), kernel_size, sigma.float(), border_type, separable).to(input.dtype)
    from kornia.filters import filter2d, filter2d_separable, get_gaussian_kernel1d
    from kornia.filters.kernels import get_gaussian_kernel2d

    ky, kx = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    bs = sigma.shape[0]
    if not separable:
        return filter2d(input, get_gaussian_kernel2d((ky, kx), sigma), border_type)
    kernel_x = get_gaussian_kernel1d(kx, sigma[:, 1].view(bs, 1))
    kernel_y = get_gaussian_kernel1d(ky, sigma[:, 0].view(bs, 1))
    return filter2d_separable(input, kernel_x, kernel_y, border_type)


def _device_blur(kernel, sigma, p: float) -> nn.Module:
    """Kornia's ``RandomGaussianBlur`` drawing on its device and blurring without a host read."""
    import kornia.augmentation as K

    blur = _on_its_device(K.RandomGaussianBlur)(kernel, sigma, p=p)
    blur._gaussian_blur2d_fn = _blur_on_device
    return blur


@functools.cache
def _on_its_device(op: type) -> type:
    """``op`` with :class:`_DrawsOnItsDevice` mixed in (same name, still an ``op``)."""
    return type(op.__name__, (_DrawsOnItsDevice, op), {"__module__": __name__})


def build_op(name: str, cfg: AugmentConfig) -> nn.Module:
    """One Kornia op from its config subsection ``cfg.<name>``, drawing its parameters on its own device.

    Colour jitter runs its four steps in a fixed order (brightness, contrast, saturation, hue, as
    the loader's colour matrix does): that path is branch-free, where a random order reads the
    order and each step's factors back on the host.
    """
    import kornia.augmentation as K

    if name == "color_jitter":
        c = cfg.color_jitter
        return _on_its_device(K.ColorJitter)(c.brightness, c.contrast, c.saturation, c.hue, p=c.p, order=(0, 1, 2, 3))
    if name == "grayscale":
        return _on_its_device(K.RandomGrayscale)(p=cfg.grayscale.p)
    if name == "gaussian_blur":
        blur = cfg.gaussian_blur
        kernel = (blur.kernel_size_px, blur.kernel_size_px)
        return _device_blur(kernel, blur.sigma, p=blur.p)
    if name == "rotation":
        return _on_its_device(K.RandomRotation)(cfg.rotation.degrees, p=cfg.rotation.p)
    if name == "erasing":
        erase = cfg.erasing
        return _on_its_device(K.RandomErasing)(scale=erase.scale, ratio=erase.ratio, value=0.0, p=erase.p)
    if name == "horizontal_flip":
        return _on_its_device(K.RandomHorizontalFlip)(p=cfg.horizontal_flip.p)
    raise ValueError(f"augment op {name!r} is not known; known ops: {', '.join(AUGMENT_OPS)}")


def apply_colour(pixels: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """``out = M @ rgb + T`` per sample on uint8 pixels, rounded half to even and saturated.

    Args:
        pixels: uint8 ``(N, 3, ...)``: images (channels_last or contiguous) or clips
            (channels_last_3d or contiguous).
        matrices: float ``(N, 3, 4)`` ``[M | T]`` per sample, on the pixels' device.

    Returns:
        uint8 pixels of the same shape; channels_last images and channels_last_3d clips stay so.
    """
    n, shape = pixels.shape[0], pixels.shape
    m, t = matrices[:, :, :3].float(), matrices[:, :, 3].float()
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(pixels.dim())
    if last is not None and not pixels.is_contiguous() and pixels.is_contiguous(memory_format=last):
        # (N, [T,] H, W, 3) is a free view of channels_last(_3d): one batched (THW, 3) @ (3, 3) per sample.
        inner = list(range(2, pixels.dim()))
        x = pixels.permute(0, *inner, 1).reshape(n, -1, 3).float()
        out = torch.baddbmm(t.unsqueeze(1), x, m.transpose(1, 2)).round_().clamp_(0, 255).to(torch.uint8)
        return out.view(n, *shape[2:], 3).permute(0, pixels.dim() - 1, *range(1, pixels.dim() - 1))
    x = pixels.contiguous().view(n, 3, -1).float()
    out = torch.baddbmm(t.unsqueeze(2), m, x).round_().clamp_(0, 255).to(torch.uint8)
    return out.view(shape)


class FusedColour(nn.Module):
    """Colour jitter and/or grayscale in one batched pass: the loader's colour matrix, drawn with torch.

    The parameters of each sample (apply-or-not and magnitudes) come from ``torch.rand`` on the
    pixels' device through :func:`gpufeed.pipelines._augment.colour_coefficients`, the formula the DALI
    graph uses, so the two places differ only in where their random numbers come from.
    """

    def __init__(self, jitter: ColourJitter | None, grayscale_p: float | None) -> None:
        super().__init__()
        self.jitter, self.grayscale_p = jitter, grayscale_p
        self.register_buffer("basis", torch.as_tensor(BASIS, dtype=torch.float32), persistent=False)

    def matrices(self, count: int, device: torch.device) -> torch.Tensor:
        """(count, 3, 4) float32 ``[M | T]`` drawn on ``device``."""
        u = torch.rand(count, DRAWS, device=device)
        coefficients = colour_coefficients(u, self.jitter, self.grayscale_p, torch)
        return (coefficients @ self.basis.to(device)).view(count, 3, 4)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return apply_colour(pixels, self.matrices(pixels.shape[0], pixels.device))


class RandomFlip(nn.Module):
    """Left-right flip of each sample (a whole clip at once) with probability ``p``, no host sync."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        chosen = torch.rand(pixels.shape[0], device=pixels.device) < self.p
        return torch.where(chosen.view(-1, *([1] * (pixels.dim() - 1))), pixels.flip(-1), pixels)


class KorniaStage(nn.Module):
    """Consecutive Kornia ops inside one uint8 -> float [0, 1] -> uint8 round trip.

    The float pixels keep the input's memory format and use ``dtype`` (bfloat16/float16 halve the
    memory traffic of every op); the result comes back as uint8 in channels_last for images.
    """

    def __init__(self, ops: list[nn.Module], clips: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.clips = clips
        if clips:
            import kornia.augmentation as K

            self.pipeline: nn.Module = K.VideoSequential(*ops, data_format="BCTHW", same_on_frame=True)
        else:
            self.pipeline = nn.Sequential(*ops)
        self._draws_on: torch.device | None = None  # where the ops' random generators draw, once moved

    def _apply(self, fn, *args, **kwargs):
        self._draws_on = None  # moved (Module.to/cuda/...): the next forward checks the generators' device
        return super()._apply(fn, *args, **kwargs)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if self._draws_on != pixels.device:
            # Kornia draws with generators set to a device (CPU until moved): move them to the pixels'.
            self.pipeline.to(pixels.device)
            self._draws_on = pixels.device
        out = self.pipeline(pixels.to(self.dtype).div_(255.0))
        out = out.mul_(255.0).round_().clamp_(0, 255)
        if self.clips:
            return out.to(torch.uint8)
        return out.to(torch.uint8, memory_format=torch.channels_last)


class Augmenter(nn.Module):
    """uint8 in, uint8 out: the device's share of the augmentation, stage by stage in order.

    Args:
        stages: uint8 -> uint8 modules (:class:`FusedColour`, :class:`RandomFlip`, Kornia stages).
        clips: Inputs are ``(N, 3, T, H, W)`` clips (same parameters on every frame).
        names: The op names the stages run, in order (for logs and benchmarks).
    """

    def __init__(self, stages: list[nn.Module], clips: bool, names: list[str] | None = None) -> None:
        super().__init__()
        self.clips = clips
        self.stages = nn.ModuleList(stages)
        self.names = list(names or [type(s).__name__ for s in stages])

    def __bool__(self) -> bool:
        return len(self.stages) > 0

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if not self.stages:
            return pixels
        expected = 5 if self.clips else 4
        if pixels.dtype != torch.uint8 or pixels.dim() != expected or pixels.shape[1] != 3:
            layout = "(N, 3, T, H, W)" if self.clips else "(N, 3, H, W)"
            raise ValueError(
                f"augmentation takes uint8 {layout} pixels, got {pixels.dtype} of shape {tuple(pixels.shape)}"
            )
        for stage in self.stages:
            pixels = stage(pixels)
        return pixels


@dataclass
class AugmentPlan:
    """Where each configured op runs, the loader's share and the device's module.

    Attributes:
        placement: op name -> ``"loader"``, ``"torch"`` or ``"kornia"``, in the order of ``augment.ops``.
        loader: What to pass as the loader's ``augment=`` (``None`` when the loader runs nothing).
        augmenter: The device's :class:`Augmenter` for every op not in the loader (may be empty).
    """

    placement: dict[str, str]
    loader: LoaderAugment | None
    augmenter: Augmenter

    def ops_at(self, place: str) -> list[str]:
        return [op for op, where in self.placement.items() if where == place]


def _placement(cfg: AugmentConfig, loader: bool) -> dict[str, str]:
    placement: dict[str, str] = {}
    all_in_loader = True  # every op so far runs in the loader: auto may put the next one there too
    for op in cfg.ops:
        where = getattr(cfg, op).where
        if where == "auto":
            if loader and all_in_loader and op in LOADER_AUGMENT_OPS:
                where = "loader"
            else:
                where = "torch" if op in LOADER_AUGMENT_OPS else "kornia"
        elif where == "loader" and not loader:
            where = "torch"  # this loader cannot augment: the same maths on the device
        all_in_loader = all_in_loader and where == "loader"
        placement[op] = where
    return placement


def _loader_share(cfg: AugmentConfig, ops: list[str]) -> LoaderAugment | None:
    if not ops:
        return None
    return LoaderAugment(
        jitter=_jitter(cfg) if "color_jitter" in ops else None,
        grayscale_p=cfg.grayscale.p if "grayscale" in ops else None,
        flip_p=cfg.horizontal_flip.p if "horizontal_flip" in ops else None,
    )


def _jitter(cfg: AugmentConfig) -> ColourJitter:
    c = cfg.color_jitter
    return ColourJitter(c.p, c.brightness, c.contrast, c.saturation, c.hue)


def _stage(kind: str, ops: list[str], cfg: AugmentConfig, clips: bool, dtype: torch.dtype) -> nn.Module:
    if kind == "kornia":
        return KorniaStage([build_op(op, cfg) for op in ops], clips, dtype)
    if kind == "colour":
        return FusedColour(
            _jitter(cfg) if "color_jitter" in ops else None, cfg.grayscale.p if "grayscale" in ops else None
        )
    return RandomFlip(cfg.horizontal_flip.p)


def _device_stages(cfg: AugmentConfig, placement: dict[str, str], clips: bool, dtype: torch.dtype):
    """Stages in list order: neighbouring torch colour ops fuse into one pass, neighbouring Kornia
    ops share one float round trip."""
    groups: list[tuple[str, list[str]]] = []
    for op, where in placement.items():
        if where == "loader":
            continue
        kind = "kornia" if where == "kornia" else ("colour" if op in _COLOUR_OPS else "flip")
        if groups and groups[-1][0] == kind and kind != "flip":
            groups[-1][1].append(op)
        else:
            groups.append((kind, [op]))
    return [_stage(kind, ops, cfg, clips, dtype) for kind, ops in groups]


def plan_augmentation(
    cfg: AugmentConfig, *, clips: bool = False, loader: bool = True, dtype: torch.dtype | None = None
) -> AugmentPlan:
    """Split ``cfg.ops`` between the loader's DALI graph and the training device.

    Every op runs exactly once: those placed in the loader go into ``plan.loader`` (give it to
    ``ImageLoader``/``ClipLoader`` as ``augment=``), every other op into ``plan.augmenter``.

    Args:
        cfg: The ``augment`` config section.
        clips: The inputs are clips (the augmenter takes ``(N, 3, T, H, W)``).
        loader: Whether the loader can run ops in its graph (gpufeed's loaders can; a
            ``torch.utils.data.DataLoader`` cannot: its share then runs as the fused torch ops,
            the same maths on the device).
        dtype: Float precision of the Kornia ops (the step's autocast dtype); ``None``: float32.
    """
    placement = _placement(cfg, loader)
    loader_ops = [op for op, where in placement.items() if where == "loader"]
    stages = _device_stages(cfg, placement, clips, dtype or torch.float32)
    device_ops = [op for op, where in placement.items() if where != "loader"]
    return AugmentPlan(placement, _loader_share(cfg, loader_ops), Augmenter(stages, clips, device_ops))


def build_augmenter(cfg: AugmentConfig, clips: bool = False, dtype: torch.dtype | None = None) -> Augmenter:
    """Every op of ``cfg.ops`` on the device (no loader share): for inputs from any loader."""
    return plan_augmentation(cfg, clips=clips, loader=False, dtype=dtype).augmenter
