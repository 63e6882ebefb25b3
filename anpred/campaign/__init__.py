"""Campaigns: many models x backend sets x input sets x runtime versions, each configuration one
``anpred test``, run on Ray (``anpred campaign``).

Modules, in the order of the walk:

- :mod:`anpred.campaign.spec`: the campaign file (TOML) and its expansion into configurations;
- :mod:`anpred.campaign.envs`: one wheel set per runtime version, prepared once;
- :mod:`anpred.campaign.tasks`: a configuration's three steps (prepare, one run per backend, judge),
  each one Ray task, each finding what an earlier attempt finished;
- :mod:`anpred.campaign.engine`: the Ray driver (embedded local Ray or a cluster), retries, resume,
  the history database;
- :mod:`anpred.campaign.summary`: the summary table, ``campaign.json`` and ``index.html``;
- :mod:`anpred.campaign.bisect`: the first runtime release where a model's verdict changes.

    from anpred.campaign import load_campaign, run_campaign
    result = run_campaign(load_campaign("campaign.toml"), "out/campaign")
    print(result.exit_code, [r["state"] for r in result.records])
"""

from anpred.campaign.engine import CampaignResult, run_campaign, start_ray
from anpred.campaign.spec import Campaign, Configuration, VersionAxis, load_campaign

__all__ = ["load_campaign", "run_campaign", "start_ray", "Campaign", "Configuration", "VersionAxis", "CampaignResult"]
