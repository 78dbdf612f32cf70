"""Tools for people: ``gpu-tailor explain`` and ``gpu-tailor capacity`` (also ``kubectl gpu-tailor``).

They answer "why is my pod Pending, and what would fit?" with the services' own decision code: the
webhook's ``mutate.decide`` and the extender's ``verbs`` over a ``Cache`` filled from a cluster dump
or a read-only list of the live cluster. This is the one package allowed to import both services;
neither service imports it (import-linter checks both).
"""
