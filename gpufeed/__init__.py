"""gpufeed: keep GPUs fed.

DALI pipelines decode images and video on the GPU (``gpufeed.pipelines``), a training loop
measures loader wait against compute, models export to ONNX (``gpufeed.models``), and a server
answers over HTTP with the same GPU decoding (``gpufeed.server``).
"""

__version__ = "0.1.0"
