"""``tunebench resume CAMPAIGN``: the one way to go on with any stopped or crashed campaign (a
ladder or a tune). The steps it finished are kept and the rest run again. It is ``tunebench
ladder|tune PROFILE --resume CAMPAIGN`` with the campaign's own profile, so the two stay one
path, and on the cluster it ran on (its stored cluster options; ``--cluster`` and the others
given here replace them, ``--no-cluster`` goes on on this machine)."""

from __future__ import annotations

import argparse
from typing import Any

from app.campaign_state import ClusterOptions
from app.cli import campaign_cmds as shared
from app.cli.argtypes import add_run_options, db_parent
from app.cli.fleet_cmds import add_cluster_options, cluster_argv
from app.errors import UserError
from app.profiles import ProfileError, resolve_profile


def cmd_resume(args: argparse.Namespace) -> int:
    from app.cli import build_parser
    from db import campaign_store
    from db.errors import StoreError

    def find(store: Any) -> campaign_store.StoredCampaign:
        try:
            return campaign_store.find_campaign(store, args.campaign)
        except StoreError as exc:
            raise UserError(str(exc)) from None

    campaign = shared.with_store(args, find)
    if args.no_cluster and args.cluster is not None:
        raise UserError("--no-cluster goes on on this machine: it cannot go with --cluster")
    stored_cluster = campaign.state.get("cluster")
    ran_on = None if args.no_cluster or not stored_cluster else ClusterOptions.model_validate(stored_cluster)
    try:
        resolve_profile(campaign.profile)
    except ProfileError:
        raise UserError(f"{campaign.kind} {campaign.id} ran profile '{campaign.profile}', which is not found here: "
                        f"tunebench {campaign.kind} PROFILE --resume {campaign.id}") from None
    argv = [campaign.kind, campaign.profile, "--resume", campaign.id]
    argv += ["--db", args.db] if args.db else []
    argv += ["--no-telemetry"] if args.no_telemetry else []
    argv += ["--verbose"] if args.verbose else []
    argv += ["--json", args.json] if args.json else []
    argv += cluster_argv(ran_on, args)
    resumed = build_parser().parse_args(argv)
    handler: Any = resumed.handler
    return int(handler(resumed))


def register(sub: argparse._SubParsersAction) -> None:
    resume = sub.add_parser("resume", parents=[db_parent()],
                            help="go on with a stopped or crashed ladder or tune: what it finished is kept, the rest "
                                 "runs again")
    resume.add_argument("campaign", help="the ladder's or tune's id (a unique start is enough; tunebench ladders and "
                                         "tunebench tunes list them)")
    resume.add_argument("--json", metavar="FILE", help="write the campaign's result as JSON")
    add_run_options(resume, store_help=None)
    add_cluster_options(resume)
    resume.add_argument("--no-cluster", action="store_true",
                        help="go on on this machine, though the campaign ran on a cluster (by default a resume "
                             "goes on on the cluster it ran on, with its options)")
    resume.set_defaults(handler=cmd_resume)
