"""The TASK step: what a deviation costs the user.

- :mod:`anpred.task.adapters`: outputs -> task results (detection, classification, dense maps, or a
  user's ``module:function``) and their comparison with the consensus' results;
- :mod:`anpred.task.impact`: :func:`task_impact` over a run's samples, with labels when there are any.
"""

from anpred.task.adapters import (
    TASKS,
    ClassifyAdapter,
    DenseAdapter,
    DetectAdapter,
    TaskAdapter,
    coco_map50,
    load_adapter,
    zoo_task,
)
from anpred.task.impact import load_labels, task_impact

__all__ = [
    "TASKS",
    "TaskAdapter",
    "DetectAdapter",
    "ClassifyAdapter",
    "DenseAdapter",
    "coco_map50",
    "load_adapter",
    "zoo_task",
    "load_labels",
    "task_impact",
]
