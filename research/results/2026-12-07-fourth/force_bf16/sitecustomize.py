# Subprocesses (e.g. a `ragkv serve` started by a test) inherit PYTHONPATH: patch torch's CPU bf16 probe
# once workers.projections is imported (it imports torch), without importing torch in every process.
import sys
import importlib.abc


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "workers.projections":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        orig = spec.loader.exec_module

        def exec_module(module):
            import torch
            torch.cpu._is_avx512_bf16_supported = lambda: True
            orig(module)
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
