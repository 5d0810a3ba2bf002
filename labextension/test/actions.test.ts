import { describe, expect, it } from 'vitest';

import { actionSpec, actionWording, KERNEL_ACTIONS } from '../src/actions';

describe('the kernel actions table', () => {
  it('lists interrupt, release cache, restart and shut down with their route', () => {
    expect(KERNEL_ACTIONS.map(a => [a.action, a.verb, a.api])).toEqual([
      ['interrupt', 'Interrupt', 'interrupt'],
      ['release', 'Release cache', 'release'],
      ['restart', 'Restart', 'restart'],
      ['shutdown', 'Shut down', 'shutdown']
    ]);
    expect(actionSpec('shutdown').warning).toContain('GPU memory is released');
    expect(actionSpec('release').warning).toBe("Frees this notebook's cached GPU memory; its variables stay.");
    // only "Release cache" keeps every variable, and only it is limited to holders on a card
    expect(KERNEL_ACTIONS.filter(a => !a.destructive).map(a => a.action)).toEqual(['release']);
    expect(KERNEL_ACTIONS.filter(a => a.onlyForHolders).map(a => a.action)).toEqual(['release']);
  });

  it('words "Release cache" as a sentence, not "Release cache the kernel of"', () => {
    expect(actionWording('release', 'train.ipynb')).toEqual({
      label: 'Release the cached GPU memory of train.ipynb',
      title: 'Release cached memory?',
      body: "Release the cached GPU memory of train.ipynb? Frees this notebook's cached GPU memory; its variables stay.",
      failure: 'Could not release the cached GPU memory of train.ipynb'
    });
  });

  it('words a button, its confirmation and its failure from the same row', () => {
    expect(actionWording('shutdown', 'train.ipynb')).toEqual({
      label: 'Shut down the kernel of train.ipynb',
      title: 'Shut down kernel?',
      body: 'Shut down the kernel of train.ipynb? All variables are lost and its GPU memory is released.',
      failure: 'Could not shut down the kernel of train.ipynb'
    });
    expect(actionWording('interrupt', 'sleep.ipynb').body).toBe(
      'Interrupt the kernel of sleep.ipynb? The running cell stops with KeyboardInterrupt.'
    );
  });
});
