//! The `aws` section of a provider entry (`type: aws`): its fields, their checks, and the
//! value checks the provider applies to the same keys when a cluster sets them. Compiled in
//! every build (serde only), so a build without the `aws` feature still explains the section.

use serde::Deserialize;

use crate::config::values::SelectorKey;

/// The per-cluster keys that select who the broker is (see `providers::overrides`): each
/// of these changes the principal the token is signed as.
pub const OVERRIDE_KEYS: &[SelectorKey] = &[
    SelectorKey {
        name: "roleArn",
        selects: "the IAM role the broker assumes with its own credentials",
        secret: false,
    },
    SelectorKey {
        name: "externalId",
        selects: "the ExternalId sent with AssumeRole (the role owner's guard against confused deputies)",
        secret: true,
    },
    SelectorKey {
        name: "sessionName",
        selects: "the role session name (trust policies and EKS username mappings can key on it)",
        secret: false,
    },
];

/// The per-cluster keys that only describe or locate the cluster: always allowed.
pub const LOCATING_KEYS: &[&str] = &["clusterName", "clusterId", "region"];

/// `RoleSessionName` when neither the provider nor the cluster names one: says in
/// CloudTrail who assumed the role.
pub const DEFAULT_SESSION_NAME: &str = "credbroker";

/// `type: aws`: EKS tokens signed with credentials from the AWS SDK's default chain,
/// optionally through an assumed role. Every key is a default a cluster's exec extension
/// may override (`region`, `roleArn`, `externalId`, `sessionName`), except `stsEndpoint`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Region of the clusters' STS endpoint, when a cluster names none.
    pub region: Option<String>,
    /// Role to assume (with the chain's credentials) before signing.
    pub role_arn: Option<String>,
    /// `ExternalId` for AssumeRole, when the role's trust policy requires one.
    pub external_id: Option<String>,
    /// `RoleSessionName` for AssumeRole (shows up in CloudTrail).
    pub session_name: Option<String>,
    /// Which STS host the token names (default regional).
    pub sts_endpoint: Option<AwsStsEndpoint>,
}

/// Which STS endpoint an EKS token is presigned for.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum AwsStsEndpoint {
    /// `sts.<region>.amazonaws.com`: what `aws eks get-token` uses, and the only kind that
    /// works in opt-in regions.
    #[default]
    Regional,
    /// `sts.amazonaws.com` (signed for us-east-1), for authenticators configured for it only.
    Global,
}

/// IAM's limits for `RoleSessionName` and `ExternalId` (AssumeRole API reference).
const AWS_SESSION_NAME_LEN: std::ops::RangeInclusive<usize> = 2..=64;
const AWS_EXTERNAL_ID_LEN: std::ops::RangeInclusive<usize> = 2..=1224;
/// Longest region name in use is 14 characters (ap-southeast-1); room for future ones.
const AWS_REGION_MAX_LEN: usize = 32;

impl Config {
    /// What the provider uses for a selector key when the cluster does not say: a cluster
    /// repeating it is not an override.
    pub fn provider_value(&self, key: &str) -> Option<&str> {
        match key {
            "roleArn" => self.role_arn.as_deref(),
            "externalId" => self.external_id.as_deref(),
            "sessionName" => Some(self.session_name.as_deref().unwrap_or(DEFAULT_SESSION_NAME)),
            _ => None,
        }
    }

    /// Checks the fields; the returned path is relative to the `aws` section.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        let checks = [
            (
                "region",
                self.region.as_deref(),
                Self::check_region as fn(&str) -> _,
            ),
            ("roleArn", self.role_arn.as_deref(), Self::check_role_arn),
            (
                "externalId",
                self.external_id.as_deref(),
                Self::check_external_id,
            ),
            (
                "sessionName",
                self.session_name.as_deref(),
                Self::check_session_name,
            ),
        ];
        for (field, value, check) in checks {
            if let Some(value) = value {
                check(value).map_err(|m| (field.to_owned(), m))?;
            }
        }
        Ok(())
    }

    /// A region name such as `us-west-2`. It becomes part of a host name, so nothing else.
    pub fn check_region(region: &str) -> Result<(), String> {
        let ok = !region.is_empty()
            && region.len() <= AWS_REGION_MAX_LEN
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !region.starts_with('-')
            && !region.ends_with('-');
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{region:?} is not an AWS region name like us-west-2"
            ))
        }
    }

    /// An IAM role ARN: `arn:<partition>:iam::<12-digit account>:role/<path/name>`.
    pub fn check_role_arn(arn: &str) -> Result<(), String> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let ok = parts.len() == 6
            && parts[0] == "arn"
            && !parts[1].is_empty()
            && parts[2] == "iam"
            && parts[3].is_empty()
            && parts[4].len() == 12
            && parts[4].bytes().all(|b| b.is_ascii_digit())
            && parts[5].len() > "role/".len()
            && parts[5].starts_with("role/");
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{arn:?} is not an IAM role ARN like arn:aws:iam::111122223333:role/name"
            ))
        }
    }

    /// IAM's rule for `ExternalId`: 2–1224 of `[\w+=,.@:/-]`.
    pub fn check_external_id(id: &str) -> Result<(), String> {
        if AWS_EXTERNAL_ID_LEN.contains(&id.len()) && id.bytes().all(|b| iam_char(b, b":/")) {
            Ok(())
        } else {
            // The value may be a shared secret with the role's owner: never echo it.
            Err("must be 2 to 1224 characters of letters, digits and +=,.@:/-_".into())
        }
    }

    /// IAM's rule for `RoleSessionName`: 2–64 of `[\w+=,.@-]`.
    pub fn check_session_name(name: &str) -> Result<(), String> {
        if AWS_SESSION_NAME_LEN.contains(&name.len()) && name.bytes().all(|b| iam_char(b, b"")) {
            Ok(())
        } else {
            Err(format!(
                "{name:?} is not a session name: 2 to 64 characters of letters, digits and +=,.@-_"
            ))
        }
    }
}

/// A character IAM allows in names and ids: `[\w+=,.@-]` plus `extra`.
fn iam_char(b: u8, extra: &[u8]) -> bool {
    b.is_ascii_alphanumeric() || b"_+=,.@-".contains(&b) || extra.contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config as BrokerConfig, ProviderSpec};

    fn err(text: &str) -> String {
        BrokerConfig::parse(text, "test.yaml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn aws_section_is_validated() {
        let aws =
            |body: &str| format!("providers:\n  - name: eks\n    type: aws\n    aws: {{{body}}}\n");
        let config = BrokerConfig::parse(
            &aws("region: us-west-2, roleArn: \"arn:aws:iam::111122223333:role/kueue\", externalId: \"ext-1\", sessionName: kueue-mgr, stsEndpoint: global"),
            "t",
        )
        .unwrap();
        let ProviderSpec::Aws(section) = &config.providers[0].spec else {
            panic!("{:?}", config.providers[0]);
        };
        assert_eq!(section.sts_endpoint, Some(AwsStsEndpoint::Global));
        assert_eq!(section.region.as_deref(), Some("us-west-2"));
        let china = "roleArn: \"arn:aws-cn:iam::111122223333:role/path/to/r\"";
        assert!(BrokerConfig::parse(&aws(china), "t").is_ok());
        // The embedded default (no section at all) is valid too.
        assert!(BrokerConfig::parse("providers:\n  - {name: eks, type: aws}\n", "t").is_ok());

        let cases = [
            (
                "region: US_WEST",
                "providers[0].aws.region: \"US_WEST\" is not an AWS region",
            ),
            ("region: \"evil.com/x\"", "providers[0].aws.region"),
            ("region: \"\"", "providers[0].aws.region"),
            (
                "roleArn: kueue",
                "providers[0].aws.roleArn: \"kueue\" is not an IAM role ARN",
            ),
            (
                "roleArn: \"arn:aws:iam::1234:role/x\"",
                "providers[0].aws.roleArn",
            ),
            (
                "roleArn: \"arn:aws:iam::111122223333:user/x\"",
                "providers[0].aws.roleArn",
            ),
            (
                "roleArn: \"arn:aws:iam::111122223333:role/\"",
                "providers[0].aws.roleArn",
            ),
            (
                "externalId: \"a\"",
                "providers[0].aws.externalId: must be 2 to 1224",
            ),
            ("externalId: \"has space\"", "providers[0].aws.externalId"),
            ("sessionName: \"a b\"", "providers[0].aws.sessionName"),
            ("sessionName: x", "providers[0].aws.sessionName"),
            (
                "stsEndpoint: fips",
                "providers[0].aws.stsEndpoint: unknown variant `fips`, expected `regional` or `global`",
            ),
            ("bogus: 1", "providers[0].aws.bogus"),
        ];
        for (body, want) in cases {
            let e = err(&aws(body));
            assert!(e.contains(want), "{body:?}: got {e:?}, want {want:?}");
        }
        // An external id may be a shared secret: its value is never echoed.
        let e = err(&aws("externalId: \"secret value\""));
        assert!(!e.contains("secret value"), "{e}");
    }
}
