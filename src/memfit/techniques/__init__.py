"""Memory techniques, one file each; techniques never import each other."""
