"""From traffic to releases: private eval sets built from captured gateway traffic (``feedback.sets``,
``tandem traffic``) and blind human review of candidate against baseline answers (``feedback.review``,
``tandem review``).

A package on the release floor: it reads the gateway's captured records and publishes to the registry; the
``traffic`` eval family (``evalsuite.families.traffic``) replays its sets.
"""
