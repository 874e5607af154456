"""The bundled model moved to :mod:`infra.bundled` (producers prepare it too); this name stays importable
until the last caller has switched."""

from infra.bundled import (
    BUNDLED_DISTRIBUTION,
    BUNDLED_NAME,
    BUNDLED_REF,
    BUNDLED_VERSION,
    CHAT_TEMPLATE,
    CHAT_TEMPLATE_NAME,
    BundledModelMissing,
    bundled_gguf_path,
    prepare_bundled_model,
    publish_bundled_model,
    tandem_home,
)

__all__ = [
    "BUNDLED_DISTRIBUTION",
    "BUNDLED_NAME",
    "BUNDLED_REF",
    "BUNDLED_VERSION",
    "CHAT_TEMPLATE",
    "CHAT_TEMPLATE_NAME",
    "BundledModelMissing",
    "bundled_gguf_path",
    "prepare_bundled_model",
    "publish_bundled_model",
    "tandem_home",
]
