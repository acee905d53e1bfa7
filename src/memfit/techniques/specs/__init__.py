"""Memory techniques, one spec each (spec.py says what a spec holds; techniques/registry.py
lists them in the order they apply): one file per technique here with ``SPEC =
TechniqueSpec(...)``, beside the technique's own code in techniques/ (as
techniques/optimizers/ holds one spec per optimizer beside optim/'s update rules).
Adding a technique = its code, its spec file, one line in techniques/registry.py, its tests.
"""
