"""GKE JobSet manifests of tst-jax runs."""
