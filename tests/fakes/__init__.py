"""Test doubles for what cannot run on these machines (SGLang) or only inside a Triton
stub (triton_python_backend_utils). They live only here and are installed through
sys.modules by the tests that use them; shipped code never imports them."""
