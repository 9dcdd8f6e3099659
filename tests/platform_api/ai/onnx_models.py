"""Small ONNX models built with the ``onnx`` package, for the registry and inference
tests: a linear classifier over three clinical features, and an image classifier that
averages each colour channel (red-dominant images score "malignant")."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# the diagnosis model: logits = x @ W + b over (temperature, wbc, platelets)
WEIGHTS = np.array([[0.8, 0.1], [-0.05, 0.3], [-0.01, 0.002]], dtype=np.float32)
BIAS = np.array([-28.0, -5.0], dtype=np.float32)


def _model(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="healthplatform-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()  # type: ignore[no-any-return]


def diagnosis_model(outputs: int = 2) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "W"], ["product"]),
         helper.make_node("Add", ["product", "b"], ["logits"])],
        "febrile-illness",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, outputs])],
        [numpy_helper.from_array(WEIGHTS[:, :outputs], "W"),
         numpy_helper.from_array(BIAS[:outputs], "b")])
    return _model(graph)


def expected_probabilities(features: list[float]) -> np.ndarray:
    logits = np.asarray(features, dtype=np.float32) @ WEIGHTS + BIAS
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()  # type: ignore[no-any-return]


def image_model(size: int = 16) -> bytes:
    # channel means → (benign, malignant) = (blue - red, red - blue) scores
    weights = np.array([[-4.0, 4.0], [0.0, 0.0], [4.0, -4.0]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["means"]),
         helper.make_node("MatMul", ["means", "W"], ["scores"])],
        "lesion-colour",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(weights, "W")])
    return _model(graph)
