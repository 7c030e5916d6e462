"""Offline checks of the deployment: compose, Dockerfile, kustomize manifests, monitoring, metrics."""
