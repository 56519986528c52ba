"""What importing the plugin does inside ms-swift: register the template and the dataset, install the guards,
and the vision-attention patch (swift_vora/vit_attention.py; SWIFT_VORA_VIT_ATTENTION=transformers to skip it)."""
_registered = False


def register_all() -> None:
    global _registered
    if _registered:
        return
    from .dataset import register_video_ora_dataset
    from .template import register_video_ora_template
    register_video_ora_template()
    register_video_ora_dataset()
    from .guards.registry import register_guards  # training guards (issue 5): callbacks_map + default-on
    register_guards()
    from .vit_attention import patch_vision_attention  # one sync and one attention call per ViT layer
    patch_vision_attention()
    _registered = True
