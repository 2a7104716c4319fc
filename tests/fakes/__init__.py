"""Test doubles for what runs only inside a Triton stub (triton_python_backend_utils) or
cannot run on these machines (the SGLang double, shared with the benchmarks, is
support/fake_sglang.py). They live only here; tests/conftest.py installs
the pb_utils double for the run, the others are installed through sys.modules by the
tests that use them; shipped code never imports them."""
