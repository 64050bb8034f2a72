"""The component schemas of the server's OpenAPI document (:mod:`._openapi`): requests, answers, errors."""

from __future__ import annotations

from gpufeed.server._errors import REASONS

__all__ = ["REF", "schemas"]

REF = "#/components/schemas/"


def _ref(name: str) -> dict:
    return {"$ref": REF + name}


def schemas(datatypes: list[str]) -> dict:
    """The `components.schemas` section; ``datatypes``: the tensor datatypes a request may name."""
    string, integer, boolean = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
    shape = {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 8}
    tensor_meta = {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {"name": string, "datatype": string, "shape": {"type": "array", "items": integer}},
    }
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": string, "reason": {"type": "string", "enum": [*REASONS, "not_ready"]}},
        },
        "Live": {"type": "object", "required": ["live"], "properties": {"live": boolean}},
        "Ready": {"type": "object", "required": ["ready"], "properties": {"ready": boolean, "error": string}},
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {"name": string, "version": string, "extensions": {"type": "array", "items": string}},
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "versions", "platform", "inputs", "outputs"],
            "properties": {
                "name": string,
                "versions": {"type": "array", "items": string},
                "platform": string,
                "inputs": {"type": "array", "items": tensor_meta},
                "outputs": {"type": "array", "items": tensor_meta},
                "parameters": {"type": "object"},
            },
        },
        "ModelConfig": {
            "type": "object",
            "description": "Triton's ModelConfig (model_config.proto) as JSON",
            "required": ["name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching"],
            "properties": {
                "name": string,
                "platform": string,
                "backend": string,
                "max_batch_size": integer,
                "input": {"type": "array", "items": {"type": "object"}},
                "output": {"type": "array", "items": {"type": "object"}},
                "dynamic_batching": {"type": "object"},
                "instance_group": {"type": "array", "items": {"type": "object"}},
                "parameters": {"type": "object"},
            },
        },
        "ModelStats": {
            "type": "object",
            "description": "Triton's statistics extension: cumulative counts and durations (ns) per model",
            "required": ["model_stats"],
            "properties": {
                "model_stats": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "inference_count", "execution_count", "inference_stats", "batch_stats"],
                        "properties": {
                            "name": string,
                            "version": string,
                            "last_inference": integer,
                            "inference_count": integer,
                            "execution_count": integer,
                            "inference_stats": {"type": "object"},
                            "batch_stats": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                }
            },
        },
        "RepositoryIndexRequest": {"type": "object", "properties": {"ready": boolean}},
        "RepositoryIndex": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "state", "reason"],
                "properties": {
                    "name": string,
                    "version": string,
                    "state": {"type": "string", "enum": ["READY", "LOADING", "UNAVAILABLE"]},
                    "reason": string,
                },
            },
        },
        "ModelReady": {
            "type": "object",
            "required": ["name", "ready"],
            "properties": {"name": string, "ready": boolean},
        },
        "ModelList": {
            "type": "object",
            "required": ["models"],
            "properties": {
                "models": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "ready"],
                        "properties": {"name": string, "ready": boolean},
                    },
                }
            },
        },
        "InferInput": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": string,
                "datatype": {"type": "string", "enum": datatypes},
                "shape": shape,
                "data": {"type": "array", "description": "row-major values, flat or nested; BYTES as strings"},
                "parameters": {
                    "type": "object",
                    "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
                },
            },
        },
        "RequestedOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {
                # Classifiers and segmentation models: logits, scores; depth models: depth.
                "name": {"type": "string", "enum": ["logits", "scores", "depth"]},
                "parameters": {
                    "type": "object",
                    "properties": {"binary_data": boolean, "classification": {"type": "integer", "minimum": 0}},
                },
            },
        },
        "InferRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": string,
                "inputs": {"type": "array", "minItems": 1, "items": _ref("InferInput")},
                "outputs": {"type": "array", "items": _ref("RequestedOutput")},
                "parameters": {"type": "object", "properties": {"binary_data_output": boolean}},
            },
        },
        "InferResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": string,
                "model_version": string,
                "id": string,
                "outputs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "datatype", "shape"],
                        "properties": {
                            "name": string,
                            "datatype": string,
                            "shape": {"type": "array", "items": integer},
                            "data": {"type": "array"},
                            "parameters": {"type": "object"},
                        },
                    },
                },
            },
        },
        "VideoScores": {
            "type": "object",
            "required": ["model", "frames", "labels", "clip_length_frames", "hop_frames", "windows", "scores"],
            "properties": {
                "model": string,
                "frames": integer,
                "fps": {"type": "number"},
                "labels": {"type": "array", "items": string},
                "multilabel": boolean,
                "clip_length_frames": integer,
                "stride_frames": integer,
                "hop_frames": integer,
                "windows": integer,
                "rule": string,
                "scores": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "window_starts": {"type": "array", "items": integer},
                "window_scores": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            },
        },
        "Predictions": {
            "type": "object",
            "required": ["model", "multilabel", "predictions"],
            "properties": {
                "model": string,
                "multilabel": boolean,
                "predictions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["image", "top_k"],
                        "properties": {
                            "image": integer,
                            "top_k": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["label", "index", "score"],
                                    "properties": {"label": string, "index": integer, "score": {"type": "number"}},
                                },
                            },
                        },
                    },
                },
            },
        },
    }
