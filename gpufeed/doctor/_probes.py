"""The doctor's probes that touch a GPU library: each does the real thing on tiny media.

Each probe takes ``device_id`` (``None``: the same work on the CPU path, which is how the tests
exercise these functions without a GPU) and returns :class:`ProbeResult` objects. They import
torch, DALI, nvImageCodec and onnxruntime, so ``gpufeed doctor`` runs each in a child process
(:mod:`gpufeed.doctor._child`): a crash in a native library is then that probe's failure.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from gpufeed.device import DeviceChoice, cuda_status
from gpufeed.doctor._media import VIDEO_CODECS, jpeg_bytes, psnr_db, source_frame, video_bytes
from gpufeed.doctor._report import ProbeResult
from gpufeed.models import IMAGENET_MEAN, IMAGENET_STD
from gpufeed.pipelines import DALI_CPU_CODECS, nvdec_problem
from gpufeed.server import execution_providers, preload_cuda_libraries

__all__ = ["HW_JPEG_CAPABILITIES", "MIN_PSNR_DB", "probe_dali_image", "probe_nvdec", "probe_onnxruntime", "probe_torch"]

# A decode this close to its source is a real decode (the media are encoded at high quality: about
# 40 dB); zeros, noise, another frame or a wrong colour conversion land far below.
MIN_PSNR_DB = 30.0
# GPUs with a hardware JPEG decoder (NVJPG engines): A100/A30 (8.0), H100/H200 (9.0), B200 (10.0).
HW_JPEG_CAPABILITIES = ((8, 0), (9, 0), (10, 0))


def _timed(name: str, started: float, status: str, summary: str, **kw) -> ProbeResult:
    return ProbeResult(name, status, summary, seconds=round(time.monotonic() - started, 3), **kw)


def _words(err: BaseException, limit: int = 300) -> str:
    """An exception's message on one line; of DALI's, the part after its operator traceback."""
    text = str(err)
    if "encountered:" in text:  # DALI: "Error in ... operator, ... traceback: ... encountered: <why> C++ context: ..."
        text = text.split("encountered:", 1)[1].split("C++ context:", 1)[0]
    return " ".join(text.split())[:limit] or type(err).__name__


def probe_torch(device_id: int | None) -> list[ProbeResult]:
    """torch on CUDA: the device is there, and a matmul on it matches the CPU's."""
    import torch

    started = time.monotonic()
    details: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda}
    if device_id is None:
        return [_timed("torch-cuda", started, "skip", "no GPU asked for", details=details)]
    if not torch.cuda.is_available():
        return [_timed("torch-cuda", started, "fail", f"torch.cuda.is_available() is False (torch {torch.__version__}, "
                       f"built for CUDA {torch.version.cuda})", details=details,
                       fallback="training with device: auto runs on the CPU")]  # fmt: skip
    name = torch.cuda.get_device_name(device_id)
    capability = torch.cuda.get_device_capability(device_id)
    details.update(gpu=name, capability=list(capability), arch_list=torch.cuda.get_arch_list())
    a = torch.linspace(-1, 1, 64 * 64).reshape(64, 64)
    want = a @ a.T
    try:
        got = (a.cuda(device_id) @ a.cuda(device_id).T).cpu()
    except RuntimeError as err:  # "no kernel image is available": a build without this GPU's architecture
        return [_timed("torch-cuda", started, "fail", f"{name}: {_words(err)}", details=details,
                       fallback="training with device: auto runs on the CPU")]  # fmt: skip
    error = float((got - want).abs().max())
    details["max_abs_error"] = error
    if error > 1e-3:
        return [_timed("torch-cuda", started, "fail", f"{name}: a 64x64 matmul differs from the CPU's by {error:.3g}",
                       details=details)]  # fmt: skip
    return [_timed("torch-cuda", started, "pass", f"{name} (compute capability {capability[0]}.{capability[1]}): a "
                   f"matmul matches the CPU's; torch {torch.__version__} built for CUDA {torch.version.cuda}",
                   details=details)]  # fmt: skip


def _decode_jpeg(data: bytes, device_id: int | None, hw_decoder_load: float) -> np.ndarray:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=1, num_threads=1, device_id=device_id, prefetch_queue_depth=1)
    def graph():
        encoded = fn.external_source(source=lambda: [np.frombuffer(data, dtype=np.uint8)], batch=True)
        if device_id is None:
            return fn.decoders.image(encoded, device="cpu", output_type=types.RGB)
        return fn.decoders.image(encoded, device="mixed", output_type=types.RGB, hw_decoder_load=hw_decoder_load)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    out = out.as_cpu() if device_id is not None else out
    return np.array(out.at(0))


def _hardware_jpeg(data: bytes, device_id: int) -> tuple[np.ndarray | None, str]:
    """nvImageCodec's hardware-only backend: the decoded image, or ``None`` and why not."""
    nvimgcodec = importlib.import_module("nvidia.nvimgcodec")  # nvImageCodec's Python API (DALI depends on it)

    try:
        decoder = nvimgcodec.Decoder(
            device_id=device_id, backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)]
        )
        image = decoder.decode(nvimgcodec.CodeStream(data))
    except RuntimeError as err:
        return None, f"nvImageCodec cannot create the hardware decoder ({_words(err, 200)})"
    if image is None:
        return None, "nvImageCodec's hardware backend declined the JPEG"
    return np.asarray(image.cpu()), ""


def probe_dali_image(device_id: int | None) -> list[ProbeResult]:
    """DALI's GPU operators, nvJPEG (CUDA decoder) and the hardware JPEG decoder, each on a real JPEG."""
    results = []
    started = time.monotonic()
    if device_id is not None:
        ok, why = cuda_status(device_id)
        results.append(_timed("dali-gpu", started, "pass" if ok else "fail", why,
                              fallback="" if ok else "device: auto trains on the CPU (DALI's CPU operators)"))  # fmt: skip
    data = jpeg_bytes()
    source = source_frame(0, 240, 320)
    name = "nvjpeg" if device_id is not None else "jpeg-cpu"
    started = time.monotonic()
    try:
        decoded = _decode_jpeg(data, device_id, hw_decoder_load=0.0)
        psnr = psnr_db(decoded, source)
    except Exception as err:  # any failure of the decode is the finding
        results.append(_timed(name, started, "fail", f"DALI's {'mixed' if device_id is not None else 'cpu'} image "
                              f"decoder failed: {_words(err)}",
                              fallback="images decode with DALI's CPU decoder only if device: cpu"))  # fmt: skip
        return results
    status = "pass" if psnr >= MIN_PSNR_DB else "fail"
    where = "nvJPEG (CUDA) decoded" if device_id is not None else "DALI's CPU decoder decoded"
    results.append(_timed(name, started, status, f"{where} a 320x240 JPEG: PSNR {psnr:.1f} dB against its source "
                          f"(at least {MIN_PSNR_DB:g})", details={"psnr_db": psnr}))  # fmt: skip
    if device_id is None:
        return results
    results.append(_probe_hw_jpeg(data, source, device_id))
    return results


def _probe_hw_jpeg(data: bytes, source: np.ndarray, device_id: int) -> ProbeResult:
    import torch

    started = time.monotonic()
    capability = tuple(torch.cuda.get_device_capability(device_id))
    expected = capability in HW_JPEG_CAPABILITIES
    decoded, why = _hardware_jpeg(data, device_id)
    if decoded is None:
        if expected:  # the engine exists; usually the driver's NVDEC library is not in the container
            return _timed("nvjpeg-hw", started, "warn", f"this GPU (compute capability {capability[0]}.{capability[1]}) "
                          f"has a hardware JPEG decoder, but {why}; in a container, NVIDIA_DRIVER_CAPABILITIES must "
                          "include 'video' (libnvcuvid.so.1)",
                          fallback="JPEGs decode with nvJPEG on the CUDA cores (slower, and it uses CPU threads)")  # fmt: skip
        return _timed("nvjpeg-hw", started, "absent", f"no hardware JPEG decoder on this GPU ({why})",
                      fallback="JPEGs decode with nvJPEG on the CUDA cores (only A100, A30, H100, H200 and B200 "
                      "have the hardware decoder)")  # fmt: skip
    psnr = psnr_db(decoded, source)
    if psnr < MIN_PSNR_DB:
        return _timed(
            "nvjpeg-hw", started, "fail", f"the hardware JPEG decoder returned a wrong image (PSNR {psnr:.1f} dB)"
        )
    try:  # and through DALI, with every JPEG sent to it, as gpufeed's hw_decoder_load does for most
        dali_psnr = psnr_db(_decode_jpeg(data, device_id, hw_decoder_load=1.0), source)
    except Exception as err:  # any failure of the decode is the finding
        return _timed("nvjpeg-hw", started, "fail", f"DALI with hw_decoder_load=1 failed: {_words(err)}")
    return _timed("nvjpeg-hw", started, "pass" if dali_psnr >= MIN_PSNR_DB else "fail",
                  f"the hardware JPEG decoder decoded a JPEG (PSNR {psnr:.1f} dB; through DALI with "
                  f"hw_decoder_load=1: {dali_psnr:.1f} dB)", details={"psnr_db": psnr, "dali_psnr_db": dali_psnr})  # fmt: skip


def _read_video(path: Path, frames: int, device_id: int | None) -> np.ndarray:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=1, num_threads=1, device_id=device_id, prefetch_queue_depth=1)
    def graph():
        return fn.experimental.readers.video(
            device="gpu" if device_id is not None else "cpu", filenames=[str(path)], sequence_length=frames,
            random_shuffle=False, image_type=types.RGB,
        )  # fmt: skip

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    out = out.as_cpu() if device_id is not None else out
    return np.array(out.at(0))


def probe_nvdec(codec: str, device_id: int | None, capability: tuple[int, int] | None = None) -> list[ProbeResult]:
    """NVDEC through DALI's video reader (the one gpufeed's clip loader uses) on an 8-frame ``codec`` video.

    What gpufeed's own NVDEC table (:func:`gpufeed.pipelines._nvdec.nvdec_problem`, NVIDIA's support
    matrix) gives to NVDEC on this GPU must decode, every frame within :data:`MIN_PSNR_DB` of its
    source (else ``fail``); what it sends to PyAV (AV1 on an A100 or H100) is ``absent``, not tried.
    On the CPU (``device_id=None``) the same with DALI's CPU reader (vp8, vp9, mjpeg).
    """
    started = time.monotonic()
    name = f"nvdec-{codec}" if device_id is not None else f"video-cpu-{codec}"
    frames = 8
    info = SimpleNamespace(codec=codec, profile="", pix_fmt="yuv420p", width=256, height=256)
    if device_id is None:
        problem = None if codec in DALI_CPU_CODECS else f"DALI's CPU reader has no {codec} decoder"
    else:
        if capability is None:  # CUDA's numbering of the GPU (what DALI uses), not NVML's
            import torch

            capability = torch.cuda.get_device_capability(device_id) if torch.cuda.is_available() else None
        problem = nvdec_problem(info, capability)
    pyav = f"{codec} videos decode with PyAV on the CPU"
    if problem is not None:  # gpufeed never sends these to the reader; a refused codec may crash it, not raise
        return [_timed(name, started, "absent", f"{problem}: not tried", details={"gpufeed_table": problem},
                       fallback=pyav)]  # fmt: skip
    try:
        data = video_bytes(codec, frames)
    except Exception as err:  # no encoder in this PyAV build: nothing to probe with
        return [_timed(name, started, "skip", f"cannot make a {codec} video here: {_words(err)}")]
    with tempfile.TemporaryDirectory(prefix="gpufeed-doctor-") as folder:
        path = Path(folder) / f"probe.{VIDEO_CODECS[codec][1]}"
        path.write_bytes(data)
        try:
            decoded = _read_video(path, frames, device_id)
            psnr = min(psnr_db(decoded[i], source_frame(i)) for i in range(frames))
        except Exception as err:  # any failure of the decode is the finding
            return [_timed(name, started, "fail", f"should decode here but failed: {_words(err)}", fallback=pyav,
                           details={"bytes": len(data)})]  # fmt: skip
    details = {"psnr_db": psnr, "bytes": len(data)}
    if psnr < MIN_PSNR_DB:
        return [_timed(name, started, "fail", f"decoded frames are wrong (lowest PSNR {psnr:.1f} dB)", details=details,
                       fallback=pyav)]  # fmt: skip
    return [_timed(name, started, "pass", f"decoded an 8-frame 256x256 {codec} video (lowest PSNR {psnr:.1f} dB)",
                   details=details)]  # fmt: skip


def _tiny_model() -> bytes:
    """uint8 (1, 3, 16, 16) in, (1, 5) out: Cast, Sub, Div (onnxruntime's own kernels, as the normalisation
    an export carries inside), Conv (cuDNN), Relu, GlobalAveragePool, Gemm (cuBLAS). A provider built
    without code for this GPU fails in the first three, whatever cuDNN and cuBLAS can run."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    conv_w = np.linspace(-0.5, 0.5, 8 * 3 * 3 * 3, dtype=np.float32).reshape(8, 3, 3, 3)
    gemm_w = np.linspace(-1, 1, 8 * 5, dtype=np.float32).reshape(8, 5)
    mean = np.array(IMAGENET_MEAN, dtype=np.float32).reshape(1, 3, 1, 1) * 255  # a model's defaults
    std = np.array(IMAGENET_STD, dtype=np.float32).reshape(1, 3, 1, 1) * 255
    nodes = [
        helper.make_node("Cast", ["pixels"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["xf", "mean"], ["xc"]),
        helper.make_node("Div", ["xc", "std"], ["x"]),
        helper.make_node("Conv", ["x", "conv_w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "gemm_w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "doctor", [helper.make_tensor_value_info("pixels", TensorProto.UINT8, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(a, n) for a, n in ((conv_w, "conv_w"), (gemm_w, "gemm_w"), (mean, "mean"), (std, "std"))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def probe_onnxruntime(device_id: int | None) -> list[ProbeResult]:
    """onnxruntime's CUDA provider with the server's own settings, every node on CUDA, against the CPU."""
    import onnxruntime as ort

    started = time.monotonic()
    model = _tiny_model()
    x = np.ascontiguousarray(source_frame(0, 16, 16).transpose(2, 0, 1)[None])  # uint8, as a served batch
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"pixels": x})[0]
    name = "onnxruntime-cuda" if device_id is not None else "onnxruntime-cpu"
    details = {"onnxruntime": ort.__version__, "available_providers": ort.get_available_providers()}
    fallback = "'gpufeed serve' refuses to start on the GPU (set serve.execution_provider: cpu to serve on the CPU)"
    options = ort.SessionOptions()
    if device_id is None:
        providers: list = ["CPUExecutionProvider"]
    else:  # the server's CUDA provider and options, without its CPU fallback
        providers = execution_providers("cuda", DeviceChoice("gpu", device_id, "doctor"), "fp32", None)[:1]
        preload_cuda_libraries()
        # Every node on CUDA, or no session: a Conv that cuDNN cannot run fails here, not silently on the CPU.
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        session = ort.InferenceSession(model, options, providers=providers)
        got = session.run(None, {"pixels": x})[0]
    except Exception as err:  # any failure to build or run the session is the finding
        return [_timed(name, started, "fail", _words(err), details=details,
                       fallback=fallback)]  # fmt: skip
    details["providers"] = session.get_providers()
    wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
    if session.get_providers()[0] != wanted:
        return [_timed(name, started, "fail", f"the session runs on {session.get_providers()[0]}, not {wanted} "
                       "(its load error is above in the output)", details=details, fallback=fallback)]  # fmt: skip
    error = float(np.max(np.abs(got - want)))
    details["max_abs_error"] = error
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        return [_timed(name, started, "fail", f"a normalise+Conv+Gemm model's output differs from the CPU's by {error:.3g}",
                       details=details)]  # fmt: skip
    return [_timed(name, started, "pass", f"a normalise+Conv+Gemm model ran on {wanted} (every node), matching the CPU "
                   f"within {error:.1g}; onnxruntime {ort.__version__}", details=details)]  # fmt: skip
