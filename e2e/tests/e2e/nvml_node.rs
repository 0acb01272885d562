//! A node agent whose resource layer runs on the NVML backend over the fake NVML library
//! (`runtimekit-fake-nvml`): what a node with real NVIDIA cards reports, proven without one.

use crate::node_agent::AgentNode;
use anyhow::Result;
use runtimekit_crds::CardHealth;
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{TestContext, tests};
use runtimekit_fake_nvml::world::Card;
use runtimekit_fake_nvml::{FakeNvml, World};

pub const TESTS: &[Test] = tests![nvml_node_reports_its_cards_and_follows_a_lost_one];

const MODEL: &str = "NVIDIA H100 80GB HBM3";

async fn nvml_node_reports_its_cards_and_follows_a_lost_one(ctx: TestContext) -> Result<()> {
    let mut world = World::h100(8);
    world.cards[7] = Card::h100(7).mig_on();
    let fake = FakeNvml::install(&world)?;
    let node = AgentNode::start_on_nvml(&ctx, "nvml", &fake.library()).await?;
    node.wait_group(&ctx, "eight H100 cards, card 7 in MIG mode", |g| {
        let cards = &g.status.as_ref()?.cards;
        let seen = cards.len() == 8
            && cards.iter().all(|c| c.model == MODEL && c.mig_capable)
            && cards.iter().filter(|c| c.mig_enabled).count() == 1
            && cards[7].mig_enabled;
        seen.then_some(())
    })
    .await?;
    // Whole cards: the seven not in MIG mode.
    node.wait_allocatable(&ctx, "nvidia.com/gpu", "7").await?;

    // Card 3 falls off the bus: its handle still resolves, every call answers GPU_IS_LOST.
    fake.edit(|w| w.cards[3].lost = true)?;
    node.wait_group(&ctx, "card 3 to be unhealthy", |g| {
        let card = g.status.as_ref()?.cards.iter().find(|c| c.index == 3)?;
        (card.health == CardHealth::Unhealthy).then_some(())
    })
    .await?;
    node.wait_allocatable(&ctx, "nvidia.com/gpu", "6").await?;

    // Back on the bus.
    fake.edit(|w| w.cards[3].lost = false)?;
    node.wait_group(&ctx, "card 3 to be healthy again", |g| {
        let card = g.status.as_ref()?.cards.iter().find(|c| c.index == 3)?;
        (card.health == CardHealth::Healthy).then_some(())
    })
    .await?;
    node.wait_allocatable(&ctx, "nvidia.com/gpu", "7").await?;
    Ok(())
}
