"""Implementation of `hybridflow.config`; import from `hybridflow.config`, not from here."""
