"""The RLJob operator: reconciles RLJob custom resources into KubeRay objects running HybridFlow."""

__version__ = "0.1.0"
