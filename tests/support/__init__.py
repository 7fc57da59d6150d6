"""Test support: a Kubernetes API emulator served over HTTP on 127.0.0.1."""
