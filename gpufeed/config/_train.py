"""Config sections for training: the model, the loop, augmentation, telemetry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from gpufeed.core import ConfigError, check_ranges, option

__all__ = ["AUGMENT_OPS", "LOADER_AUGMENT_OPS", "AugmentConfig", "ModelConfig", "TelemetryConfig", "TrainConfig"]

_FLOAT32_MAX = 3.4028234663852886e38
Schedule = Literal["cosine", "linear", "constant"]
AmpMode = Literal["auto", "bf16", "fp16", "off"]
CompileMode = Literal["off", "default", "reduce-overhead"]
AugmentOp = Literal["color_jitter", "grayscale", "gaussian_blur", "rotation", "erasing", "horizontal_flip"]
AUGMENT_OPS: tuple[str, ...] = get_args(AugmentOp)
# Where an op runs: inside the loader's DALI graph, gpufeed's fused torch op on the training
# device, or Kornia on the training device; auto picks (see AugmentConfig).
ColourPlace = Literal["auto", "loader", "torch", "kornia"]
KorniaPlace = Literal["auto", "kornia"]
DenseTaskName = Literal["depth", "segmentation"]
LOADER_AUGMENT_OPS: tuple[str, ...] = ("color_jitter", "grayscale", "horizontal_flip")
_COLOUR_WHERE_DOC = (
    "where it runs: loader (inside the DALI graph), torch (fused op on the training device), kornia; "
    "auto: the loader when every op before it runs there too, else torch"
)
_KORNIA_WHERE_DOC = "where it runs: kornia on the training device (auto means the same; DALI has no such op)"


@dataclass(frozen=True)
class ModelConfig:
    """The network to train.

    Its input size and evaluation crop are not set here: they are the image pipeline's
    ``image.size_px`` and ``image.eval_crop_fraction`` (the video pipeline's for clip models), so
    the model's spec, the pipelines, the export and the server cannot disagree.
    """

    name: str = option(
        "resnet18",
        doc="registry name: resnet18, smallcnn (images), clip_resnet18, r3d_small (clips), unet_resnet18 (dense maps)",
    )
    task: DenseTaskName | None = option(
        None,
        doc="a dense model's task: depth or segmentation; null: depth when the data has depth maps, else segmentation",
    )
    num_classes: int | None = option(None, ge=1, doc="output classes; null: the number of classes in the data")
    mean: tuple[float, float, float] | None = option(
        None, ge=0.0, le=1.0, doc="per-channel mean of [0, 1] pixels, applied inside the model; null: the model's"
    )
    std: tuple[float, float, float] | None = option(
        None, gt=0.0, doc="per-channel std of [0, 1] pixels, applied inside the model; null: the model's"
    )


@dataclass(frozen=True)
class TrainConfig:
    """The training loop: length, optimiser (AdamW), schedule, precision, checkpoints, evaluation."""

    epochs: int = option(10, ge=1, doc="passes over the training split; also the learning-rate schedule's length")
    max_steps: int | None = option(
        None,
        ge=1,
        doc="stop after this many optimizer steps in total (the schedule still spans 'epochs'); null: no limit",
    )
    # torch's AdamW takes the rate as a float32 scalar: a larger one was an overflow traceback.
    lr: float = option(1e-3, gt=0.0, le=_FLOAT32_MAX, doc="peak learning rate of AdamW")
    weight_decay: float = option(0.05, ge=0.0, doc="AdamW decoupled weight decay")
    schedule: Schedule = option("cosine", doc="learning-rate decay after warm-up, over all steps of 'epochs'")
    warmup_steps: int = option(0, ge=0, doc="linear warm-up from 0 to lr over this many steps")
    min_lr_fraction: float = option(0.0, ge=0.0, le=1.0, doc="final learning rate as a fraction of lr")
    amp: AmpMode = option("auto", doc="mixed precision: auto = bf16 on a GPU that has it, else fp16; off on the CPU")
    channels_last: bool = option(True, doc="run convolutions in channels_last memory format")
    compile: CompileMode = option(
        "off",
        doc="torch.compile the model in place: default fuses its small ops (fewer kernels for the host to "
        "launch); reduce-overhead also replays each step's kernels as CUDA graphs (a GPU); off: eager",
    )
    grad_clip_norm: float | None = option(None, gt=0.0, doc="clip the gradient norm to this; null: no clipping")
    label_smoothing: float = option(0.0, ge=0.0, lt=1.0, doc="label smoothing of the image cross-entropy")
    checkpoint_every_steps: int = option(
        500, ge=0, doc="also checkpoint every this many steps (always at epoch ends and at the end); 0: never between"
    )
    keep_checkpoints: int = option(3, ge=1, doc="newest checkpoints kept in RUN_DIR/checkpoints")
    eval_every_epochs: int = option(1, ge=0, doc="evaluate on data.val every this many epochs and at the end; 0: never")
    progress: bool = option(True, doc="show a progress bar with throughput and the share of time waiting for data")


@dataclass(frozen=True)
class ColorJitterConfig:
    """Random brightness, contrast, saturation and hue.

    In the loader and the fused torch op: one colour matrix per sample (contrast about mid-grey,
    hue as a rotation about the grey axis; ``gpufeed.pipelines._augment``). In Kornia:
    ``ColorJitter`` in a fixed order (brightness, contrast, saturation, hue).
    """

    where: ColourPlace = option("auto", doc=_COLOUR_WHERE_DOC)
    p: float = option(0.8, ge=0.0, le=1.0, doc="probability per sample")
    brightness: float = option(0.2, ge=0.0, doc="brightness factor drawn from [1 - b, 1 + b]")
    contrast: float = option(0.2, ge=0.0, doc="contrast factor drawn from [1 - c, 1 + c]")
    saturation: float = option(0.2, ge=0.0, doc="saturation factor drawn from [1 - s, 1 + s]")
    hue: float = option(0.05, ge=0.0, le=0.5, doc="hue shift drawn from [-h, h] (fraction of a turn)")


@dataclass(frozen=True)
class GrayscaleConfig:
    """Random grayscale (luma 0.299 R + 0.587 G + 0.114 B on all three channels)."""

    where: ColourPlace = option("auto", doc=_COLOUR_WHERE_DOC)
    p: float = option(0.1, ge=0.0, le=1.0, doc="probability per sample")


@dataclass(frozen=True)
class GaussianBlurConfig:
    """Kornia ``RandomGaussianBlur``."""

    where: KorniaPlace = option("auto", doc=_KORNIA_WHERE_DOC)
    p: float = option(0.2, ge=0.0, le=1.0, doc="probability per sample")
    kernel_size_px: int = option(3, ge=3, doc="odd kernel side in pixels")
    sigma: tuple[float, float] = option((0.1, 1.5), gt=0.0, doc="range of the blur's standard deviation in pixels")

    def __post_init__(self) -> None:
        if self.kernel_size_px % 2 == 0:
            raise ConfigError("kernel_size_px", f"value {self.kernel_size_px} must be odd")
        check_ranges(self, "sigma")


@dataclass(frozen=True)
class RotationConfig:
    """Kornia ``RandomRotation`` (bilinear)."""

    where: KorniaPlace = option("auto", doc=_KORNIA_WHERE_DOC)
    p: float = option(0.3, ge=0.0, le=1.0, doc="probability per sample")
    degrees: float = option(10.0, gt=0.0, le=180.0, doc="rotation drawn from [-degrees, degrees]")


@dataclass(frozen=True)
class ErasingConfig:
    """Kornia ``RandomErasing``: a random rectangle set to black."""

    where: KorniaPlace = option("auto", doc=_KORNIA_WHERE_DOC)
    p: float = option(0.25, ge=0.0, le=1.0, doc="probability per sample")
    scale: tuple[float, float] = option((0.02, 0.2), gt=0.0, le=1.0, doc="range of the erased share of the area")
    ratio: tuple[float, float] = option((0.3, 3.3), gt=0.0, doc="range of the erased rectangle's aspect ratio")

    def __post_init__(self) -> None:
        check_ranges(self, "scale", "ratio")


@dataclass(frozen=True)
class HorizontalFlipConfig:
    """Random left-right flip (the image pipeline already flips with ``image.flip``; useful for clips).

    In the loader it toggles the image crop's own flip (free, folded into the resize) or flips the
    whole clip.
    """

    where: ColourPlace = option("auto", doc=_COLOUR_WHERE_DOC.replace("fused op", "flip"))
    p: float = option(0.5, ge=0.0, le=1.0, doc="probability per sample")


@dataclass(frozen=True)
class AugmentConfig:
    """Training augmentation: which ops, in which order, and where each runs (``<op>.where``).

    Three places: ``loader`` (inside the loader's DALI graph, on the GPU when the loader is;
    per-sample parameters from the crop windows' hash, so deterministic per (seed, epoch,
    sample)): ``color_jitter``, ``grayscale`` and ``horizontal_flip``; ``torch`` (gpufeed's fused
    ops on the training device, the same maths as the loader's, batched, no host syncs): the same
    three; ``kornia`` (on the training device, in the step's precision): every op. ``auto``
    (default) puts an op in the loader when every op listed before it runs there too, so the
    order of ``ops`` always holds; otherwise in the fused torch op, or Kornia for ops only Kornia
    has. The loader's ops run before the device's, so an explicit ``where: loader`` after a
    device op moves it first. Every op keeps the uint8 contract (uint8 in, uint8 out), so the
    model sees exactly what it sees when served; clips get the same parameters on every frame of
    a clip. Evaluation and serving never augment.
    """

    ops: tuple[AugmentOp, ...] = option(("color_jitter",), doc="ops to apply, in order; [] for none")
    color_jitter: ColorJitterConfig = field(default_factory=ColorJitterConfig)
    grayscale: GrayscaleConfig = field(default_factory=GrayscaleConfig)
    gaussian_blur: GaussianBlurConfig = field(default_factory=GaussianBlurConfig)
    rotation: RotationConfig = field(default_factory=RotationConfig)
    erasing: ErasingConfig = field(default_factory=ErasingConfig)
    horizontal_flip: HorizontalFlipConfig = field(default_factory=HorizontalFlipConfig)

    def __post_init__(self) -> None:
        seen = set()
        for op in self.ops:
            if op in seen:
                raise ConfigError("ops", f"op {op!r} is listed twice; list each op once")
            seen.add(op)


@dataclass(frozen=True)
class TelemetryConfig:
    """Per-step timings: Prometheus on a metrics port, JSON lines in the run folder."""

    metrics_host: str = option("127.0.0.1", doc="address the /metrics endpoint binds (127.0.0.1: this machine only)")
    metrics_port: int = option(
        9400, ge=0, le=65535, doc="metrics port of local rank 0 (rank r: port + r); 0: pick free ports"
    )
    linger_seconds: float = option(0.0, ge=0.0, doc="keep serving /metrics this long after training ends")
    record_sample_ids: bool = option(False, doc="also write each step's sample ids to the step log (debugging)")
