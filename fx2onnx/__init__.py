"""PFN's exporter package as MLSDK programs import from it: `from fx2onnx import set_tensor_name`
(PFN's ncf_training and slm_sft examples name `.grad` tensors so). mnsim traces with torch's own
make_fx, not an ONNX exporter, so this package only holds the naming functions, the same objects
`mlsdk` exports: a tensor named through either is named for both."""

from mlsdk.naming import get_tensor_name, set_tensor_name

__all__ = ["get_tensor_name", "set_tensor_name"]
