"""Kubernetes manifests from a deployment spec and its placement plan (`trident k8s`),
and the monitoring objects (`trident monitoring`)."""
