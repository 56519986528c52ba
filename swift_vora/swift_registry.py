"""What importing the plugin does inside ms-swift: register the template and the dataset."""
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
    _registered = True
