"""Mutating admission webhook: portable GPU asks in, real NVIDIA resources out."""
