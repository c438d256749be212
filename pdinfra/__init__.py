"""pdinfra: provisioning and validation for prefill/decode-disaggregated LLM inference."""

__version__ = "0.2.0"
