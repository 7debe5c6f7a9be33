"""A local stand-in for the Hugging Face Hub's bucket API and Xet's CAS (and the Space repository routes
`spaces/deploy.py` calls), for tests and contributors.

Built from what the real clients send (huggingface_hub 2.x, hf_xet 1.8) and from xet-core's protocol, not from the
Hub: see docs/local-hub.md. Tests start it as a subprocess through `tests.local_hub.server.LocalHub`; this package's
`__init__` imports nothing, so `tests/conftest.py` collects without the web stack.
"""
