//! A route's `lanes` (DESIGN §8.5): the one home of the rules a list of
//! lanes keeps, for the config file and for lanes built in code.

use crate::config::defaults;
use crate::config::error::{ConfigErrors, FieldPath};
use crate::config::problems::Problems;
use crate::config::raw::RawLane;
use crate::config::{is_lane_name, Lane, Lanes, MAX_LANES, MAX_LANE_NAME_LEN, MAX_LANE_WEIGHT};

/// `lanes`: one to [`MAX_LANES`], each named once ([`is_lane_name`]) with a
/// weight of 1 to [`MAX_LANE_WEIGHT`] (default [`defaults::LANE_WEIGHT`]).
/// Without the setting, one lane, [`Lane::main`].
pub(super) fn lanes(
    raw: Option<Vec<RawLane>>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Lanes> {
    let Some(raw) = raw else {
        return Some(Lanes::default());
    };
    let at = at.key("lanes");
    if raw.is_empty() {
        problems.report(
            at,
            format!(
                "give at least one lane, or leave `lanes` out for one lane, {}",
                defaults::LANE
            ),
        );
        return None;
    }
    if raw.len() > MAX_LANES {
        problems.report(at, format!("{} lanes: at most {MAX_LANES}", raw.len()));
        return None;
    }
    let mut lanes = Vec::with_capacity(raw.len());
    let mut ok = true;
    for (i, lane) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let name = match lane.name {
            None => {
                problems.report(at.key("name"), "missing: every lane has a name");
                None
            }
            Some(name) if !is_lane_name(&name) => {
                problems.report(
                    at.key("name"),
                    format!(
                        "invalid lane name {name:?}: use 1 to {MAX_LANE_NAME_LEN} of a-z 0-9 _ -"
                    ),
                );
                None
            }
            Some(name) if lanes.iter().any(|l: &Lane| l.name == name) => {
                problems.report(at.key("name"), format!("lane {name:?} is named twice"));
                None
            }
            Some(name) => Some(name),
        };
        let weight = lane.weight.unwrap_or(defaults::LANE_WEIGHT);
        if !(1..=MAX_LANE_WEIGHT).contains(&weight) {
            problems.report(
                at.key("weight"),
                format!("{weight} is out of range: use 1 to {MAX_LANE_WEIGHT}"),
            );
            ok = false;
        }
        match name {
            Some(name) => lanes.push(Lane { name, weight }),
            None => ok = false,
        }
    }
    ok.then(|| Lanes(lanes.into()))
}

/// [`Lanes::new`]: lanes built in code, checked by the rules of [`lanes`].
pub(crate) fn lanes_from_code(lanes: Vec<Lane>) -> Result<Lanes, ConfigErrors> {
    let raw = lanes
        .into_iter()
        .map(|lane| RawLane {
            name: Some(lane.name),
            weight: Some(lane.weight),
        })
        .collect();
    let mut problems = Problems::default();
    match self::lanes(Some(raw), &FieldPath::root(), &mut problems) {
        Some(lanes) if problems.is_empty() => Ok(lanes),
        _ => Err(problems.into_errors(|_| None)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, problem_paths};
    use crate::config::{Lane, Lanes};

    #[test]
    fn lanes_default_to_main_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].lanes, [Lane::main()]);
        let config = parse(&route(
            ", lanes: [{ name: main }, { name: vip, weight: 3 }]",
        ))
        .unwrap();
        assert_eq!(
            config.routes[0].lanes,
            [
                Lane::main(),
                Lane {
                    name: "vip".to_owned(),
                    weight: 3
                }
            ]
        );
        assert_eq!(problem_paths(&route(", lanes: []")), ["routes[0].lanes"]);
        assert_eq!(
            problem_paths(&route(
                ", lanes: [{ name: main }, { name: VIP }, { name: main }, { weight: 2 }, { name: b, weight: 0 }, { name: c, weight: 1001 }]"
            )),
            [
                "routes[0].lanes[1].name",
                "routes[0].lanes[2].name",
                "routes[0].lanes[3].name",
                "routes[0].lanes[4].weight",
                "routes[0].lanes[5].weight"
            ]
        );
        let nine = (0..9)
            .map(|i| format!("{{ name: l{i} }}"))
            .collect::<Vec<_>>()
            .join(", ");
        assert_eq!(
            problem_paths(&route(&format!(", lanes: [{nine}]"))),
            ["routes[0].lanes"]
        );
    }

    #[test]
    fn lanes_built_in_code_are_checked_by_the_same_rules() {
        let lane = |name: &str, weight: u32| Lane {
            name: name.to_owned(),
            weight,
        };
        let paths = |lanes: Vec<Lane>| -> Vec<String> {
            let errors = Lanes::new(lanes).expect_err("invalid lanes");
            errors.errors.into_iter().map(|e| e.path).collect()
        };
        assert_eq!(paths(vec![]), ["lanes"]);
        assert!(Lanes::new(vec![lane("main", 1), lane("vip-2_x", 1000)]).is_ok());
        for bad in ["", "Main", "a b", "ab:c", "{x}", "seventeen-chars-x"] {
            assert_eq!(paths(vec![lane(bad, 1)]), ["lanes[0].name"], "{bad:?}");
        }
        for weight in [0, 1001] {
            assert_eq!(paths(vec![lane("a", weight)]), ["lanes[0].weight"]);
        }
        assert_eq!(paths(vec![lane("a", 1), lane("a", 2)]), ["lanes[1].name"]);
        let many = (0..17).map(|i| lane(&format!("l{i}"), 1)).collect();
        assert_eq!(paths(many), ["lanes"]);
    }
}
